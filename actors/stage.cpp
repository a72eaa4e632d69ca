#include "actors/stage.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include <caf/stateful_actor.hpp>

#include "actors/stage_checkpoint.hpp"
#include "actors/stage_runtime.hpp"
#include "planning/profile.hpp"
#include "runtime/dataset.hpp"
#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/loopback_communicator.hpp"
#include "runtime/sampler.hpp"
#include "runtime/solo_communicator.hpp"
#include "runtime/stage_executor.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;
using namespace stage_detail;

namespace {

struct stage_state {
  std::shared_ptr<stage_runtime> rt;
  int slot = 0;  ///< runs the epoch's stage `slot` of this node; slot 0 also forms and commits
  static inline const char* name = "oobleck.stage";
};

using stage_pointer = stage_actor::stateful_pointer<stage_state>;

/// Runs the step on the node's stage `slot` (caller holds views_mu shared).
stage_done run(stage_runtime& rt, const stage_step& order, int slot) {
  const auto started = std::chrono::steady_clock::now();
  const auto& s = rt.assignment.stages.at(static_cast<std::size_t>(slot));
  auto& executor = *rt.executors.at(static_cast<std::size_t>(slot));
  // A stage of width d computes with d intra-op threads: the setting belongs to this slot's own
  // thread (OpenMP's thread count is per thread), so the node's stages keep their own widths.
  torch::set_num_threads(s.width);
  stage_done done{order.epoch, order.step, s.pipeline, s.stage, 0, {}};
  auto& activity = rt.activity.at(static_cast<std::size_t>(slot));
  activity.owner.store(std::this_thread::get_id());
  activity.set(slot_activity::computing);
  struct idle_after {
    slot_activity& a;
    ~idle_after() {
      a.set(slot_activity::idle);
      a.owner.store({});
    }
  } idle{activity};
  try {
    if (order.eval) {
      // An evaluation round: forward passes over validation windows, nothing to commit.
      auto& validation = rt.validation.at(static_cast<std::size_t>(slot));
      if (!validation) {
        if (rt.job.validation.empty()) throw std::runtime_error("the job has no validation data ([data] validation)");
        validation.emplace(runtime::make_dataset(rt.job.validation, rt.job.model.seq_len, rt.job.model.vocab));
      }
      if (order.first_microbatch < 0 || order.microbatches < 0 ||
          order.first_microbatch + order.microbatches > validation->size())
        throw std::invalid_argument("validation windows [" + std::to_string(order.first_microbatch) + ", " +
                                    std::to_string(order.first_microbatch + order.microbatches) +
                                    ") are not inside the validation data's " + std::to_string(validation->size()));
      std::vector<std::int64_t> ids(static_cast<std::size_t>(order.microbatches));
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = order.first_microbatch + static_cast<std::int64_t>(i);
      const auto [inputs, targets] = validation->batch(ids);
      done.loss_sum = executor.run_eval(order.microbatches, inputs, targets);
      done.timing.busy_ms = ms_since(started);
      return done;
    }
    const auto all = rt.samples.step_samples(static_cast<std::int64_t>(order.step));
    const auto b = static_cast<std::size_t>(rt.job.microbatch);
    const std::vector<std::int64_t> ids(all.begin() + static_cast<std::ptrdiff_t>(order.first_microbatch * b),
                                        all.begin() + static_cast<std::ptrdiff_t>((order.first_microbatch + order.microbatches) * b));
    const auto [inputs, targets] = rt.data.batch(ids);
    done.loss_sum = executor.run_step(static_cast<std::int64_t>(order.step), order.first_microbatch,
                                      order.microbatches, inputs, targets, rt.layer_groups);
    rt.fire_faults(order.epoch, order.step);
    activity.set(slot_activity::waiting);  // for the all-reduces (they run on the reducer's thread too)
    executor.reduce_gradients(rt.layer_groups);
    if (rt.job.optimizer.clip_norm > 0) done.grad_sq = executor.gradient_sq_norm();
    rt.gradients_done.at(static_cast<std::size_t>(slot)) = static_cast<std::int64_t>(order.step);
  } catch (const std::exception& e) {
    rt.gradients_done.at(static_cast<std::size_t>(slot)) = -1;
    done.error = what_of(e);
    // This stage's own failure (out of memory, a c10::Error): its peers must not wait for it. Told
    // before anything else: discarding the step cancels its all-reduces, its peers fail, and the
    // coordinator's abort of the epoch could otherwise arrive first and hide whose failure it was.
    if (!data_plane_failure(e) && rt.aborted_epoch.load() < order.epoch) rt.own_failure(order.epoch, done.error);
    if (!order.eval) executor.discard();
  }
  const auto& t = executor.last_step_timing();
  done.timing = {ms_since(started), t.compute_ms, t.p2p_wait_ms, t.allreduce_ms};
  if (done.error.empty()) {
    done.forward_ms.assign(t.forward_op_ms.begin(), t.forward_op_ms.end());
    done.backward_ms.assign(t.backward_op_ms.begin(), t.backward_op_ms.end());
  }
  return done;
}

/// Slot 0's: only it forms epochs, applies commits and writes checkpoints for the node.
caf::error slot_zero_only(int slot, const char* what) {
  return make_error(protocol_error::bad_request,
                    std::string(what) + " goes to the node's first stage slot, not slot " + std::to_string(slot));
}

stage_actor::behavior_type stage_behavior(stage_pointer self, std::shared_ptr<stage_runtime> rt, int slot) {
  self->state.rt = std::move(rt);
  self->state.slot = slot;
  runtime::use_device_on_this_thread(self->state.rt->store.device());  // a detached actor: its own thread
  return {
      [self](epoch_assignment& a) -> caf::result<form_timing> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "an epoch assignment");
        auto& rt = *self->state.rt;
        try {
          return form(rt, a);
        } catch (const std::exception& e) {
          // A copy or an allocation that failed here (not a peer, not an abort) is this node's.
          if (!data_plane_failure(e) && rt.aborted_epoch.load() < a.epoch) rt.own_failure(a.epoch, what_of(e));
          return make_error(protocol_error::bad_request, "forming the stage: " + what_of(e));
        }
      },
      [self](stage_step& order) -> stage_done {
        auto& rt = *self->state.rt;
        const auto slot = static_cast<std::size_t>(self->state.slot);
        auto not_formed = [&]() -> stage_done {
          return {order.epoch, order.step, -1, -1, 0,
                  "stage slot " + std::to_string(slot) + " is not formed for epoch " + std::to_string(order.epoch)};
        };
        if (order.commit_first) {
          // The previous step's commit rode with these orders: applied here unless the monitor's
          // commit_step or another slot's order applied it already; the monitor hears at once.
          if (order.commit.epoch != order.epoch || order.commit.step + 1 != order.step)
            return {order.epoch, order.step, -1, -1, 0,
                    "the commit sent with step " + std::to_string(order.step) + " is not its previous step's"};
          try {
            apply_commit(rt, order.commit, true);
          } catch (const std::exception& e) {
            return {order.epoch, order.step, -1, -1, 0, e.what()};
          }
          // With digests asked for, their thread tells the monitor once they are ready.
          if (!order.commit.digests) rt.report_applied(order.commit.epoch, order.commit.step);
        }
        std::shared_lock views(rt.views_mu);
        if (slot >= rt.executors.size() || order.epoch != rt.assignment.epoch) return not_formed();
        return run(rt, order, self->state.slot);
      },
      [self](commit_step& c) -> caf::result<step_committed> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a commit");
        try {
          // With the next step's orders on their way (with_run), its digests are computed while
          // that step runs, wherever the commit is applied first.
          return apply_commit(*self->state.rt, c, c.with_run);
        } catch (const std::exception& e) {
          return make_error(protocol_error::bad_request, "commit failed: " + std::string(e.what()));
        }
      },
      [self](memory_atom) -> caf::result<node_memory> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a memory request");
        // What the node kept for a replacement coordinator: every layer with its digest and
        // update count, and whether its stages still hold a finished step's gradients. Asked
        // after the data plane was aborted, so no step of the node still runs.
        auto& rt = *self->state.rt;
        std::unique_lock views(rt.views_mu);
        node_memory m;
        m.views_epoch = rt.formed_epoch.load();
        if (!rt.executors.empty()) {
          const std::int64_t step = rt.gradients_done.front();
          bool all = true;
          for (std::size_t j = 0; j < rt.executors.size(); ++j) all = all && rt.gradients_done.at(j) == step;
          if (all) m.gradients_step = step;
        }
        for (int l : rt.store.layers_held())
          m.layers.push_back({planning::layer_index{l}, rt.store.parameter_digest(l), rt.store.optimizer_state(l).step});
        return m;
      },
      [self](write_checkpoint& w) -> caf::result<checkpoint_written> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a checkpoint");
        std::shared_lock views(self->state.rt->views_mu);
        return write_checkpoint_layers(self->state.rt->store, w);
      },
  };
}

}  // namespace

std::vector<double> train_single_process(const stage_job& job, std::uint64_t steps,
                                         std::vector<std::vector<std::byte>>* final_layers) {
  runtime::use_one_compute_thread();
  const runtime::token_dataset data = runtime::make_dataset(job.train, job.model.seq_len, job.model.vocab);
  const runtime::sampler samples(job.sample_seed, data.size(), job.global_batch);
  runtime::solo_communicator comm;
  const int layers = job.model.num_layers();
  // On the job's device, as the stages: a GPU job's reference run is on the same GPU.
  runtime::layer_store store(job.model, device_of(job));
  store.ensure(0, layers);
  runtime::stage_executor executor(store, {0, layers, 0, 1, -1, -1}, comm, options_of(job));
  const int microbatches = job.global_batch / job.microbatch;
  std::vector<double> losses;
  for (std::uint64_t k = 0; k < steps; ++k) {
    const auto [inputs, targets] = data.batch(samples.step_samples(static_cast<std::int64_t>(k)));
    losses.push_back(executor.run_step(static_cast<std::int64_t>(k), 0, microbatches, inputs, targets) / microbatches);
    executor.tie_gradients();
    const double norm = job.optimizer.clip_norm > 0 ? std::sqrt(executor.gradient_sq_norm()) : 0;
    executor.commit(runtime::clip_scale(job.optimizer.clip_norm, norm));
  }
  if (final_layers)
    for (int l = 0; l < layers; ++l) final_layers->push_back(store.serialize_layer(l));
  return losses;
}

spawned_stage spawn_stage(caf::actor_system& sys, const stage_job& job, int slots) {
  if (!planning::is_power_of_two(slots) || slots > 64)
    throw std::invalid_argument("a node has 1, 2, 4, ..., 64 slots, not " + std::to_string(slots));
  // One LibTorch thread per slot: the node's cores belong to its stages (and other nodes' on a
  // shared machine); intra-op threads only fight over them. A stage of width d sets d on its
  // own thread (run()); the BLAS library's pool stays at one thread (it is the process's, not a
  // thread's: runtime/device.hpp).
  runtime::use_one_compute_thread();
  auto rt = std::make_shared<stage_runtime>(job, slots);
  spawned_stage out;
  out.actor = sys.spawn<caf::detached>(stage_behavior, rt, 0);
  for (int j = 1; j < slots; ++j) out.runners.push_back(sys.spawn<caf::detached>(stage_behavior, rt, j));
  out.abort = [rt](std::uint64_t epoch, const std::string& reason) { rt->abort(epoch, reason); };
  out.arm = [rt](const messages::inject_fault& f, std::function<void(const messages::inject_fault&)> act) {
    std::lock_guard lock(rt->fault_mu);
    rt->armed.emplace_back(f, std::move(act));
  };
  out.activity = [rt] {
    messages::stall_report r;
    r.epoch = rt->forming_epoch.load();
    r.formed = rt->formed_epoch.load() >= r.epoch;
    r.forming_blocked = rt->forming_blocked.load();
    double computing = 0, waiting = 0;
    for (const auto& a : rt->activity) {
      computing = std::max(computing, a.ms_in(slot_activity::computing));
      waiting = std::max(waiting, a.ms_in(slot_activity::waiting));
    }
    r.computing_ms = computing;
    r.waiting_ms = waiting;
    return r;
  };
  out.report_failures_to = [rt](std::function<void(std::uint64_t, const std::string&, bool)> sink) {
    std::lock_guard lock(rt->sink_mu);
    rt->failure_sink = std::move(sink);
  };
  out.applied = [rt](std::uint64_t epoch, std::uint64_t step) -> std::optional<messages::step_committed> {
    std::lock_guard lock(rt->commit_mu);
    if (!rt->answer_to(epoch, step)) return std::nullopt;
    // Digests computed while the next step runs: their thread says when they are ready. One that
    // failed is reported by slot 0's reply to the commit (it throws there).
    try {
      if (!take_deferred_digests(*rt, epoch, step, rt->applied_answer, false)) return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;
    }
    return rt->applied_answer;
  };
  out.digests_coming = [rt](std::uint64_t epoch, std::uint64_t step) { return rt->digests.holds(epoch, step); };
  out.report_commits_to = [rt](std::function<void(std::uint64_t, std::uint64_t)> sink) {
    std::lock_guard lock(rt->sink_mu);
    rt->commit_sink = std::move(sink);
  };
  return out;
}

}  // namespace oobleck::actors
