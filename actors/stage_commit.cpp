// Applying a commit on a node: AdamW on every stage it runs, once, and the layers' digests, now
// or on a thread of their own while the next step runs (actors/stage_digests.hpp).

#include <string>

#include "actors/stage_runtime.hpp"

namespace oobleck::actors::stage_detail {

namespace {

/// What the layers' digests of the node's stages are computed over after a commit (where the
/// coordinator checks replicas). Caller holds views_mu.
digest_inputs digest_inputs_of(stage_runtime& rt) {
  const auto& model = rt.store.model();
  digest_inputs in;
  for (auto& e : rt.executors) {
    const auto& p = e->position();
    for (int l = p.first_layer; l < p.end_layer; ++l) {
      in.layers.emplace_back(l, rt.store.flat_parameters(l));
      if (runtime::tied(model) && (l == 0 || l == model.num_layers() - 1))
        in.tied.emplace_back(l, rt.store.flat_parameters(l).slice(0, 0, model.vocab * model.d_model));
    }
  }
  return in;
}

/// The layers' digests of the node's stages, now. Caller holds views_mu.
void add_digests(stage_runtime& rt, step_committed& out) { compute_digests(digest_inputs_of(rt), out); }

/// Hands the digests of commit (epoch, step) to their own thread (stage_digests.hpp): the step
/// whose orders carried the commit runs meanwhile. The monitor hears when they are ready. Caller
/// holds commit_mu and views_mu exclusively, and has just applied the commit.
void defer_digests(stage_runtime& rt, std::uint64_t epoch, std::uint64_t step) {
  const auto device = rt.store.device();
  rt.digests.start(
      epoch, step, digest_inputs_of(rt), [device] { runtime::use_device_on_this_thread(device); },
      [&rt, epoch, step] { rt.report_applied(epoch, step); });
}

}  // namespace

/// The digests of commit (epoch, step) computed on their own thread, into `answer`: waited for
/// when `wait`, else left while they are not ready (false). Throws (after reporting the node's own
/// failure) when computing them failed. Caller holds commit_mu.
bool take_deferred_digests(stage_runtime& rt, std::uint64_t epoch, std::uint64_t step, step_committed& answer,
                           bool wait) {
  if (wait) rt.digests.join();
  std::string error;
  switch (rt.digests.take(epoch, step, answer, error)) {
    case deferred_digests::taken::not_ready: return false;
    case deferred_digests::taken::failed: {
      const std::string what = "the digests of step " + std::to_string(step) + ": " + error;
      rt.own_failure(epoch, what, true);
      throw std::runtime_error(what);
    }
    default: return true;
  }
}

/// Applies commit `c` to every stage of the node, once. The commit applied last (the same epoch
/// and step) answers what it answered then (with digests computed now if they were not asked for
/// then); an older one of the same epoch changes nothing and answers without digests (steps
/// commit in order, each once; only a new epoch may start again from a checkpoint's earlier
/// step). Such late copies are ordinary with run-ahead: slot 0's copy of commit k may wait in its
/// mailbox behind step k + 1, whose orders applied k, and then behind k + 1's own commit, applied
/// by step k + 2's orders. A commit of another epoch than the node's changes nothing. Throws
/// (after reporting the node's own failure) when applying fails: part of the step may be applied.
/// `deferred`: the commit rode with the next step's orders (which a slot runs next); its digests
/// are then computed on their own thread meanwhile (defer_digests), the answer returned has none,
/// and the monitor collects them when that thread says they are ready (stage_runtime::
/// report_applied, then spawned_stage::applied).
step_committed apply_commit(stage_runtime& rt, const commit_step& c, bool deferred) {
  std::lock_guard commit_lock(rt.commit_mu);
  if (const auto* answer = rt.answer_to(c.epoch, c.step)) {
    // Orders that carried it need nothing more; slot 0's copy of a commit sent with orders
    // answers without waiting for digests still computed (the monitor waits for their nudge).
    take_deferred_digests(rt, c.epoch, c.step, rt.applied_answer, !deferred);
    if (deferred) return *answer;
    step_committed again = *answer;
    if (c.digests && again.digests.empty()) {
      std::shared_lock views(rt.views_mu);
      if (c.epoch == rt.assignment.epoch) add_digests(rt, again);
    }
    return again;
  }
  if (c.epoch == rt.applied_epoch && static_cast<std::int64_t>(c.step) < rt.applied_step)
    return {c.epoch, c.step, -1, {}};
  std::unique_lock views(rt.views_mu);  // no stage of the node runs now (see views_mu)
  rt.digests.join();  // the last commit's digests, if still computed, read what this one updates
  const auto started = std::chrono::steady_clock::now();
  step_committed out{c.epoch, c.step, -1, {}};
  if (c.epoch != rt.assignment.epoch) return out;
  if (rt.pruned_epoch != c.epoch) {  // a step of this epoch committed: it formed everywhere
    rt.drop_layers_outside_range();  // an idle node: every layer it kept for a failed forming
    rt.pruned_epoch = c.epoch;
  }
  // Every stage of the node has reported (the coordinator commits only then) and none runs until
  // the next step: this thread applies the step to all of them.
  try {
    for (auto& e : rt.executors) {
      e->commit(c.grad_scale.value);
      out.optimizer_ms += e->last_step_timing().optimizer_ms;
    }
    if (c.digests && !deferred) add_digests(rt, out);
  } catch (const std::exception& e) {
    // Part of the step may be applied: this node's layers are no longer the committed state.
    const std::string what = "applying the commit of step " + std::to_string(c.step) + ": " + what_of(e);
    rt.own_failure(c.epoch, what, true);
    throw std::runtime_error(what);
  }
  std::fill(rt.gradients_done.begin(), rt.gradients_done.end(), -1);
  out.commit_ms = ms_since(started);
  rt.applied_epoch = c.epoch;
  rt.applied_step = static_cast<std::int64_t>(c.step);
  rt.applied_answer = out;
  if (c.digests && deferred) defer_digests(rt, c.epoch, c.step);
  return out;
}

}  // namespace oobleck::actors::stage_detail
