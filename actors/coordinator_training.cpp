#include "actors/coordinator_training.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <variant>

#include <caf/send.hpp>

#include "actors/coordinator_checkpoint.hpp"
#include "runtime/optimizer_options.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// Closes the record of the step being committed: its loss, samples, pipelines and the digests
/// received (all of them, or those of the survivors when a node was lost during the commit),
/// prints the progress line, checks the replicas, reports the record and moves to the next step.
void record_committed_step(coordinator_pointer self, step_progress& progress, const std::string& note) {
  auto& st = self->state;
  auto& rec = progress.record;
  const std::int64_t microbatches = st.deps.job.global_batch / st.deps.job.microbatch;
  rec.loss = progress.loss_sum / static_cast<double>(microbatches);
  rec.samples = st.deps.job.global_batch;
  const auto now = st.deps.now();
  rec.wall_ms = ms_between(st.step_started, now);
  rec.breakdown = progress.timing.finish(now);
  rec.ideal_ms = progress.ideal_known && progress.ideal_pipeline_ms > 0
                     ? progress.ideal_pipeline_ms + progress.slowest_optimizer_ms
                     : 0;
  rec.predicted_ms = st.predicted_step_ms;
  rec.pipelines.clear();
  for (const auto& p : st.current.pipelines) rec.pipelines.push_back({p.nodes, p.stage_layers, p.microbatches});
  std::string mismatch;
  for (const auto& [layer, digests] : rec.layer_digests)
    if (std::adjacent_find(digests.begin(), digests.end(), std::not_equal_to<>()) != digests.end())
      mismatch += " " + std::to_string(layer.value);
  const auto& tied = rec.tied_digests;
  const bool tied_differ = std::adjacent_find(tied.begin(), tied.end(), std::not_equal_to<>()) != tied.end();
  st.last_loss = rec.loss;
  st.samples_per_second = rec.wall_ms > 0 ? 1000.0 * rec.samples / rec.wall_ms : 0;
  ++st.committed;
  std::ostringstream line;
  line.precision(4);
  line << "step " << st.step << ": loss " << rec.loss << ", " << std::fixed;
  line.precision(1);
  line << st.samples_per_second << " samples/s, " << rec.wall_ms << " ms, " << st.current.pipelines.size()
       << " pipeline(s), epoch " << st.epoch << note;
  st.deps.log(line.str());
  if (!mismatch.empty())
    st.deps.log("ERROR: replicas of layer(s)" + mismatch + " disagree after step " + std::to_string(st.step));
  if (tied_differ) {
    ++st.tied_mismatches;
    st.deps.log("ERROR: the copies of the tied embedding (layer 0 and the last layer) disagree after step " +
                std::to_string(st.step));
  }
  note_committed(self, rec.wall_ms);
  st.deps.on_step(rec);
  publish(self, {event_kind::step_committed, st.epoch, st.step, -1, rec.loss, {}});
  ++st.step;
  if (st.deps.eval_every > 0 && st.step % st.deps.eval_every == 0) st.eval_due = true;
}

/// -> training: a round of st.step starts now (a step, or with `eval` an evaluation round), every
/// pipeline of the epoch to report; the caller sends the orders and arms the deadline.
void enter_round(coordinator_pointer self, bool eval) {
  auto& st = self->state;
  phase::training next;
  next.eval = eval;
  next.pipelines_pending = st.current.pipelines.size();
  next.step.record.step = st.step;
  next.step.record.epoch = st.epoch;
  st.step_started = st.deps.now();
  next.step.timing.start(st.step_started);
  enter(self, std::move(next));
}

/// training(eval) -> training: the first eval_windows validation windows, split across the pipelines
/// in proportion to their microbatches (every pipeline holds every layer, so any split gives the
/// same mean up to rounding), each pipeline's share in chunks of its microbatch size.
void run_eval(coordinator_pointer self) {
  auto& st = self->state;
  enter_round(self, true);
  const std::int64_t total = st.deps.job.global_batch / st.deps.job.microbatch;
  const std::int64_t windows = st.deps.eval_windows;
  std::int64_t first = 0, microbatches_before = 0;
  for (auto& p : st.current.pipelines) {
    microbatches_before += p.microbatches;
    // Pipeline i gets windows [W * before_i / total, W * (before_i + mb_i) / total).
    const std::int64_t end = windows * microbatches_before / total;
    self->send(p.actor, messages::run_step{st.epoch, st.step, true, static_cast<std::int32_t>(first),
                                           static_cast<std::int32_t>(end - first)});
    first = end;
  }
  arm_step_deadline(self);
}

/// Whether the step after the one being committed (st.step) follows its commit at once: what
/// after_commit and maybe_periodic_checkpoint will decide, as far as it is known now (a node that
/// registers during the commit waits for the next boundary).
bool next_step_follows(const coordinator_state& st) {
  const std::uint64_t next = st.step + 1;
  if (!st.deps.run_ahead || next >= st.deps.steps || !st.joining.empty()) return false;
  if (st.deps.eval_every > 0 && next % st.deps.eval_every == 0) return false;  // an evaluation round first
  const auto& ck = st.deps.checkpoint;
  if (ck.every != 0 && !ck.root.empty() && next % ck.every == 0) return false;  // a checkpoint first
  return true;
}

bool runs_stages(const coordinator_state& st, node_id id) {
  for (const auto& p : st.current.pipelines)
    if (std::find(p.nodes.begin(), p.nodes.end(), id) != p.nodes.end()) return true;
  return false;
}

/// committing(ahead) -> training: the step whose orders went out with the commit just completed is
/// in force now; its wall time starts here, its breakdown at its orders. Failures and reports that
/// came early are handled then, failures first (a stage that failed fails its pipeline's report).
void enter_ahead_round(coordinator_pointer self, phase::committing& ph) {
  auto& st = self->state;
  const auto sent = ph.ahead_sent;
  auto early = std::move(ph.early);
  auto early_faults = std::move(ph.early_faults);
  phase::training next;
  next.pipelines_pending = st.current.pipelines.size();
  next.step.record.step = st.step;
  next.step.record.epoch = st.epoch;
  st.step_started = st.deps.now();
  next.step.timing.start(sent);
  next.step.timing.ahead_ms = ms_between(sent, st.step_started);
  enter(self, std::move(next));
  arm_step_deadline(self);
  // The step is under way (its orders went out with the commit) and now the one in force: the
  // coordinator's own fault injection sees it here, once its previous step is recorded.
  st.deps.on_step_sent(st.step);
  // Each failure is the step's: a strike and a retry, or, once an earlier one formed the epoch
  // again, a strike of the epoch gone.
  for (auto& f : early_faults)
    if (!handle_in_phase(self, f)) ++st.dropped;
  for (auto& d : early) {
    auto* t = std::get_if<phase::training>(&st.phase);
    if (!t) break;  // a failure or a report failed the step, or the last report committed it
    if (!handle(self, *t, d)) ++st.dropped;
  }
}

}  // namespace

/// -> training: sends step st.step to every pipeline actor of the epoch (an evaluation round first
/// when one is due).
void run_step(coordinator_pointer self) {
  auto& st = self->state;
  if (st.eval_due) return run_eval(self);
  enter_round(self, false);
  for (auto& p : st.current.pipelines) self->send(p.actor, messages::run_step{st.epoch, st.step});
  arm_step_deadline(self);
  st.deps.on_step_sent(st.step);
}

/// A failure while committing: the commit was decided before it, so it stands. Survivors apply it
/// before anything of the next epoch (their stages handle messages in order); the record holds the
/// digests that arrived (the lost node's never will). Once: the failure's handling may lead here
/// again (a loss whose policy says checkpoint and stop), and the step is already counted then.
void commit_stands_if_decided(coordinator_pointer self, std::optional<node_id> lost_node) {
  auto& st = self->state;
  auto* c = std::get_if<phase::committing>(&st.phase);
  if (!c || c->stood) return;
  c->stood = true;
  record_stood_commit(self, c->step, lost_node ? to_string(*lost_node) + " was lost" : "the failure", lost_node);
  st.last_commit = st.deps.now();
}

void record_stood_commit(coordinator_pointer self, step_progress& progress, const std::string& before,
                         std::optional<node_id> lost_node) {
  auto& st = self->state;
  st.deps.log("step " + std::to_string(st.step) + " was committed before " + before);
  publish(self, {event_kind::commit_stood, st.epoch, st.step, lost_node ? lost_node->value : -1, 0, {}});
  record_committed_step(self, progress, " (committed before " + before + "; digests of the nodes that replied)");
}

void check_transition(coordinator_pointer self, std::string_view to) {
  auto& st = self->state;
  const auto from = phase_name(st.phase);
  if (transition_allowed(from, to)) return;
  ++st.illegal_transitions;
  const std::string what =
      "the coordinator went from " + std::string(from) + " to " + std::string(to) + ", an edge its machine does not have";
  st.deps.log("BUG: " + what);
  st.deps.on_bug(what);
}

void publish(coordinator_pointer self, const job_event& event) {
  self->state.deps.on_event(event);
  // Subscribers are untyped (users write them); typed actors reach them anonymously.
  for (auto& s : self->state.subscribers) caf::anon_send(s, event);
}

void stop_job(coordinator_pointer self, stop_outcome outcome, const std::string& reason) {
  auto& st = self->state;
  const bool failed = outcome != stop_outcome::finished && outcome != stop_outcome::shutdown;
  enter(self, phase::stopped{outcome, reason});
  st.deps.log((failed ? "stopping (failed): " : "stopping: ") + reason);
  for (auto& [id, n] : st.nodes)
    if (n.state != node_state::lost) self->send(n.monitor, shutdown_atom_v, reason);
  job_event e{event_kind::stopped, st.epoch, st.step, -1, st.last_loss, reason};
  e.outcome = outcome;
  e.committed = st.committed;
  publish(self, e);
  for (auto& p : st.current.pipelines)
    if (p.actor) self->send_exit(p.actor, caf::exit_reason::user_shutdown);
  if (failed)
    self->quit(make_error(protocol_error::bad_request, reason));
  else
    self->quit();
}

void after_commit(coordinator_pointer self) {
  auto& st = self->state;
  if (st.step >= st.deps.steps && !st.eval_due) {
    st.deps.log("training finished: " + std::to_string(st.committed) + " step(s) committed");
    return stop_job(self, stop_outcome::finished, "training finished");
  }
  // Nodes that registered during the step enter now, at the step boundary.
  if (!st.joining.empty()) return enter_forming(self, std::nullopt);
  run_step(self);
}

bool handle(coordinator_pointer self, phase::training& ph, pipeline_done& d) {
  auto& st = self->state;
  if (d.epoch != st.epoch || d.step != st.step || d.eval != ph.eval) return false;
  if (!d.error.empty()) {
    // A failed evaluation is handled as a failed step: the epoch is formed again and the round
    // runs again (eval_due stays set) before the next step.
    on_retry(self,
             (ph.eval ? "the evaluation before step " : "step ") + std::to_string(d.step) + " failed in pipeline " +
                 std::to_string(d.pipeline) + ": " + d.error,
             std::nullopt);
    return true;
  }
  ph.step.loss_sum += d.loss_sum;
  if (d.pipeline == 0) ph.step.grad_sq = d.grad_sq;
  if (d.ideal_ms.value > 0) ph.step.ideal_pipeline_ms = std::max(ph.step.ideal_pipeline_ms, d.ideal_ms.value);
  else ph.step.ideal_known = false;
  ph.step.timing.on_pipeline_done(d, st.deps.now());
  if (!ph.eval && ph.pipelines_pending == st.current.pipelines.size()) st.deps.on_first_pipeline_done(st.step);
  if (--ph.pipelines_pending > 0) return true;
  if (ph.eval) {
    eval_record r;
    r.step = st.step - 1;
    r.epoch = st.epoch;
    r.windows = st.deps.eval_windows;
    r.loss = ph.step.loss_sum / static_cast<double>(r.windows);
    r.wall_ms = ms_between(st.step_started, st.deps.now());
    st.eval_due = false;
    ++st.evaluations;
    std::ostringstream line;
    line.precision(4);
    line << "eval after step " << r.step << ": loss " << r.loss << " over " << r.windows << " validation window(s), "
         << std::fixed;
    line.precision(1);
    line << r.wall_ms << " ms";
    st.deps.log(line.str());
    st.deps.on_eval(r);
    after_commit(self);
    return true;
  }
  // Every pipeline reported: the step is committed, everywhere, now. With clipping, the factor is
  // pipeline 0's: every replica applies the same one, so they stay bitwise equal.
  if (st.deps.clip_norm > 0) {
    ph.step.record.grad_norm = std::sqrt(ph.step.grad_sq);
    ph.step.record.grad_scale = runtime::clip_scale(st.deps.clip_norm, ph.step.record.grad_norm);
  }
  const double scale = ph.step.record.grad_scale;
  // Digests where the replicas are checked: every digest_every steps, the first commit of every
  // epoch (after a reconfiguration, the copied layers are compared with their sources'
  // replicas) and the job's last step.
  const bool digests = st.deps.faults.digest_every <= 1 || st.step % st.deps.faults.digest_every == 0 ||
                       st.digested_epoch != st.epoch || st.step + 1 == st.deps.steps;
  if (digests) st.digested_epoch = st.epoch;
  phase::committing next{std::move(ph.step), {}};
  next.pending.insert(st.current.nodes.begin(), st.current.nodes.end());
  enter(self, std::move(next));
  if (st.deps.partial_commit_at == st.step) {
    // Testing: the coordinator dies right after deciding, its commit having reached one node only.
    self->send(st.nodes.at(st.current.nodes.front()).monitor, commit_step{st.epoch, st.step, scale, digests});
    st.deps.log("testing: step " + std::to_string(st.step) + "'s commit sent to " + to_string(st.current.nodes.front()) +
                " only; the coordinator dies now");
    st.deps.die();
    return true;
  }
  auto& committing = std::get<phase::committing>(st.phase);
  committing.ahead = next_step_follows(st);
  for (node_id id : st.current.nodes)
    self->send(st.nodes.at(id).monitor,
               commit_step{st.epoch, st.step, scale, digests, committing.ahead && runs_stages(st, id)});
  if (committing.ahead) {
    // The next step's orders go with the commit: every stage applies it before running them.
    committing.ahead_sent = st.deps.now();
    messages::run_step order{st.epoch, st.step + 1};
    order.commit_first = true;
    order.commit = commit_step{st.epoch, st.step, scale, digests, true};
    for (auto& p : st.current.pipelines) self->send(p.actor, order);
  }
  arm_commit_deadline(self);
  return true;
}

bool handle(coordinator_pointer, phase::committing& ph, pipeline_done& d) {
  // A report of the step sent ahead (the gate checked its epoch and sender): it waits until the
  // commit before it completes.
  if (!ph.ahead || d.eval || d.step != ph.step.record.step + 1) return false;
  ph.early.push_back(std::move(d));
  return true;
}

bool handle(coordinator_pointer self, phase::committing& ph, step_committed& c) {
  auto& st = self->state;
  if (c.epoch != st.epoch || c.step != st.step || ph.pending.erase(c.node) == 0) return false;
  ph.step.timing.on_step_committed(c);
  for (const auto& d : c.digests) ph.step.record.layer_digests[d.layer].push_back(d.digest);
  for (const auto& d : c.tied_digests) ph.step.record.tied_digests.push_back(d.digest);
  ph.step.slowest_optimizer_ms = std::max(ph.step.slowest_optimizer_ms, c.optimizer_ms.value);
  if (!ph.pending.empty()) return true;

  const std::uint64_t committed_step = st.step;
  record_committed_step(self, ph.step, "");
  st.failures_without_loss = 0;
  if (st.recovering) {
    st.recovering->downtime_ms = ms_between(st.last_commit, st.deps.now());
    st.deps.log("back to training: step " + std::to_string(committed_step) + " committed " +
                std::to_string(static_cast<long long>(st.recovering->downtime_ms)) +
                " ms after the last commit before the reconfiguration");
    st.deps.on_reconfigured(*st.recovering);
    st.recovering.reset();
  }
  if (st.restoring) {
    st.restoring->downtime_ms = ms_between(st.last_commit, st.deps.now());
    st.deps.on_restored(*st.restoring);
    st.restoring.reset();
  }
  st.last_commit = st.deps.now();
  if (ph.ahead) return enter_ahead_round(self, ph), true;  // none of after_commit's cases is due
  if (maybe_periodic_checkpoint(self)) return true;  // after_commit once it is written
  after_commit(self);
  return true;
}

}  // namespace oobleck::actors
