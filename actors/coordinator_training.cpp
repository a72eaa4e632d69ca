#include "actors/coordinator_training.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/coordinator_checkpoint.hpp"
#include "actors/pipeline.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

std::vector<std::int64_t> live_nodes(const coordinator_state& st) {
  std::vector<std::int64_t> out;
  for (const auto& [id, n] : st.nodes)
    if (n.state != "lost") out.push_back(id);
  return out;
}

messages::stage_assignment to_message(const planning::stage_assignment& s) {
  return {s.pipeline,
          s.stage,
          s.num_stages,
          s.first_layer.value,
          s.end_layer.value,
          s.prev ? s.prev->value : -1,
          s.next ? s.next->value : -1,
          s.gpus};
}

void run_step(coordinator_pointer self) {
  auto& st = self->state;
  st.pipelines_pending = st.pipelines.size();
  st.loss_sum = 0;
  st.record = {};
  st.record.step = st.step;
  st.record.epoch = st.epoch;
  st.step_started = st.deps.now();
  st.timing.start(st.step_started);
  for (auto& p : st.pipelines) self->send(p.actor, messages::run_step{st.epoch, st.step});
}

void start_training(coordinator_pointer self) {
  auto& st = self->state;
  st.job_state = "training";
  // Every node formed the epoch: its configuration is where the layers are now.
  st.formed_once = true;
  st.formed = st.forming;
  st.lost_since_formed.clear();
  // The joining nodes this epoch was planned with are in; one that registered while it formed
  // is not, and enters at the next step boundary.
  std::erase_if(st.joining, [&](std::int64_t id) {
    const auto in = [id](const std::vector<int>& nodes) { return std::find(nodes.begin(), nodes.end(), id) != nodes.end(); };
    bool planned = in(st.formed.idle_nodes);
    for (const auto& p : st.formed.pipelines) planned = planned || in(p.nodes);
    if (planned) st.nodes.at(id).state = "registered";
    return planned;
  });
  if (st.recovering) {
    auto& rec = *st.recovering;
    rec.form_ms = std::chrono::duration<double, std::milli>(st.deps.now() - st.assignments_sent).count();
    rec.copy_ms = rec.copy_wait_ms = rec.connect_ms = rec.prepare_ms = rec.views_ms = 0;
    for (const auto& [node, t] : st.ready_timing) {
      rec.copy_ms = std::max(rec.copy_ms, static_cast<double>(t.copies_us) / 1000);
      rec.copy_wait_ms = std::max(rec.copy_wait_ms, static_cast<double>(t.copy_wait_us) / 1000);
      rec.prepare_ms = std::max(rec.prepare_ms, static_cast<double>(t.prepare_us) / 1000);
      rec.connect_ms = std::max(rec.connect_ms, static_cast<double>(t.connect_us) / 1000);
      rec.views_ms = std::max(rec.views_ms, static_cast<double>(t.views_us) / 1000);
    }
  } else {
    st.last_commit = st.deps.now();  // the job's first epoch: downtime counts from here
  }
  for (std::size_t i = 0; i < st.pipelines.size(); ++i) {
    pipeline_deps d;
    d.epoch = st.epoch;
    d.index = static_cast<std::int32_t>(i);
    d.first_microbatch = st.pipelines[i].first_microbatch;
    d.microbatches = st.pipelines[i].microbatches;
    d.coordinator = self;
    for (const auto& [node, index] : st.stage_nodes[i])
      d.stages.push_back(caf::actor_cast<stage_actor>(st.ready.at(node).at(static_cast<std::size_t>(index))));
    st.pipelines[i].actor = self->spawn(pipeline, std::move(d));
  }
  std::ostringstream shape;
  for (std::size_t i = 0; i < st.pipelines.size(); ++i)
    shape << (i ? ", " : "") << st.stage_nodes[i].size() << " stage(s) x "
          << st.pipelines[i].microbatches << " microbatch(es)";
  st.deps.log("epoch " + std::to_string(st.epoch) + " formed: " + std::to_string(st.pipelines.size()) +
              " pipeline(s): " + shape.str());
  publish(self, {event_kind::epoch_formed, st.epoch, st.step, -1, 0, shape.str()});
  run_step(self);
}

}  // namespace

void publish(coordinator_pointer self, const job_event& event) {
  self->state.deps.on_event(event);
  // Subscribers are untyped (users write them); typed actors reach them anonymously.
  for (auto& s : self->state.subscribers) caf::anon_send(s, event);
}

void stop_job(coordinator_pointer self, stop_outcome outcome, const std::string& reason) {
  auto& st = self->state;
  const bool failed = outcome != stop_outcome::finished && outcome != stop_outcome::shutdown;
  st.job_state = failed ? "failed" : "stopped";
  st.deps.log((failed ? "stopping (failed): " : "stopping: ") + reason);
  for (auto& [id, n] : st.nodes)
    if (n.state != "lost") self->send(n.monitor, shutdown_atom_v, reason);
  job_event e{event_kind::stopped, st.epoch, st.step, -1, st.last_loss, reason};
  e.outcome = outcome;
  e.committed = st.committed;
  publish(self, e);
  for (auto& p : st.pipelines)
    if (p.actor) self->send_exit(p.actor, caf::exit_reason::user_shutdown);
  if (failed)
    self->quit(make_error(protocol_error::bad_request, reason));
  else
    self->quit();
}

namespace {

/// Sends every live node its part of `ep` and waits for them in state "forming".
void send_epoch(coordinator_pointer self, const planning::epoch& ep, const std::vector<std::int64_t>& live) {
  auto& st = self->state;
  st.job_state = "forming";
  ++st.epoch;
  st.assignments_sent = st.deps.now();
  st.ready.clear();
  st.ready_timing.clear();
  st.in_epoch = live;
  for (auto& p : st.pipelines)
    if (p.actor) self->send_exit(p.actor, caf::exit_reason::user_shutdown);
  st.pipelines.clear();
  st.stage_nodes.assign(ep.pipelines().size(), {});
  std::int32_t first = 0;
  for (std::size_t i = 0; i < ep.pipelines().size(); ++i) {
    running_pipeline p;
    for (auto r : ep.pipelines()[i].ranks) p.nodes.push_back(ep.node(r).value);
    p.first_microbatch = first;
    p.microbatches = ep.pipelines()[i].microbatches;
    first += p.microbatches;
    st.pipelines.push_back(std::move(p));
  }

  epoch_assignment base;
  base.epoch = st.epoch;
  base.next_step = st.step;
  for (int r = 0; r < ep.num_ranks(); ++r) base.peers.push_back(st.nodes.at(ep.node(planning::rank{r}).value).data);
  for (int l = 0; l < ep.num_layers(); ++l) {
    std::vector<std::int32_t> group;
    for (auto r : ep.holders(planning::layer_index{l})) group.push_back(r.value);
    base.layer_groups.push_back(std::move(group));
  }
  for (const auto& c : ep.copies()) base.copies.push_back({c.layer.value, c.from.value, c.to.value});
  for (const auto& p : st.pipelines) base.pipeline_microbatches.push_back(p.microbatches);
  // A resumed job's layers come from its checkpoint until an epoch has formed everywhere.
  if (!st.formed_once) base.resume_dir = st.deps.checkpoint.resume_dir;

  for (std::int64_t id : live) {
    epoch_assignment a = base;
    if (auto r = ep.rank_of(planning::node_id{static_cast<int>(id)})) {
      a.rank = r->value;
      const auto& stages = ep.stages(*r);
      for (std::size_t k = 0; k < stages.size(); ++k) {
        a.stages.push_back(to_message(stages[k]));
        auto& slots = st.stage_nodes.at(static_cast<std::size_t>(stages[k].pipeline));
        slots.resize(std::max<std::size_t>(slots.size(), static_cast<std::size_t>(stages[k].stage) + 1));
        slots[static_cast<std::size_t>(stages[k].stage)] = {id, static_cast<std::int32_t>(k)};
      }
    }
    self->send(st.nodes.at(id).monitor, std::move(a));
  }
}

}  // namespace

void form_epoch(coordinator_pointer self) {
  auto& st = self->state;
  const auto live = live_nodes(st);
  planning::job_config job = st.deps.job;
  job.nodes = static_cast<int>(live.size());
  planning::job_plan plan;
  try {
    plan = planning::plan_job(st.deps.profile, job);
  } catch (const std::exception& e) {
    return stop_job(self, stop_outcome::failed, std::string("cannot plan the job on ") + std::to_string(live.size()) +
                              " node(s): " + e.what());
  }
  for (auto& p : plan.pipelines)
    for (auto& n : p.nodes) n = static_cast<int>(live.at(static_cast<std::size_t>(n)));
  for (auto& n : plan.idle_nodes) n = static_cast<int>(live.at(static_cast<std::size_t>(n)));
  st.templates = plan.templates;
  st.formed = st.forming = {plan.pipelines, plan.idle_nodes};
  st.lost_since_formed.clear();
  send_epoch(self, planning::map_epoch(plan), live);
  publish(self, {event_kind::epoch_forming, st.epoch, st.step, -1, 0, {}});
  st.deps.log("forming epoch " + std::to_string(st.epoch) + " on " + std::to_string(live.size()) +
              " node(s), " + std::to_string(st.pipelines.size()) + " pipeline(s), predicted step " +
              std::to_string(plan.step_ms) + " ms");
}

namespace {
void record_committed_step(coordinator_pointer self, const std::string& note);
}  // namespace

void recover(coordinator_pointer self, std::optional<std::int64_t> lost_node) {
  auto& st = self->state;
  if (st.checkpointing && checkpoint_interrupted(self, lost_node)) return;
  if (st.job_state == "committing") {
    // The commit was decided before the loss: it stands. Survivors apply it before anything of
    // the next epoch (their stages handle messages in order); the record holds the digests that
    // arrived (the lost node's never will).
    st.deps.log("step " + std::to_string(st.step) + " was committed before " +
                (lost_node ? "node " + std::to_string(*lost_node) + " was lost" : "the failure"));
    publish(self, {event_kind::commit_stood, st.epoch, st.step, lost_node.value_or(-1), 0, {}});
    record_committed_step(self, " (committed before the failure; digests of the nodes that replied)");
    st.last_commit = st.deps.now();
  }
  if (!st.formed_once) {
    // Nothing has trained yet, and no epoch has formed everywhere: plan the job afresh on the
    // survivors (every layer from its seed; there is nothing to copy).
    for (std::int64_t id : st.in_epoch) {
      const auto& n = st.nodes.at(id);
      if (n.state != "lost") self->send(n.monitor, abort_epoch{st.epoch, "re-planning before the first step"});
    }
    st.deps.log("node lost before the job's first epoch formed: planning the job again on the survivors");
    return form_epoch(self);
  }
  const std::uint64_t old_epoch = st.epoch;
  const std::string reason = lost_node ? "node " + std::to_string(*lost_node) + " was lost" : "the epoch failed";
  for (std::int64_t id : st.in_epoch) {
    const auto& n = st.nodes.at(id);
    if (n.state != "lost") self->send(n.monitor, abort_epoch{old_epoch, reason});
  }
  if (lost_node) {
    st.lost_since_formed.push_back(*lost_node);
    st.failures_without_loss = 0;
  }
  if (st.step >= st.deps.steps) {
    st.deps.log("training finished: " + std::to_string(st.committed) + " step(s) committed");
    return stop_job(self, stop_outcome::finished, "training finished");
  }

  const auto started = st.deps.now();
  const double detect_ms = std::chrono::duration<double, std::milli>(started - st.step_started).count();
  const planning::layer_costs costs(st.deps.profile, planning::job_memory(st.deps.profile, st.deps.job));
  const planning::reconfiguration_context ctx{st.templates, costs, st.deps.job.fault_tolerance,
                                              st.deps.job.global_batch / st.deps.job.microbatch,
                                              st.deps.job.microbatch};
  std::vector<int> lost(st.lost_since_formed.begin(), st.lost_since_formed.end());
  std::vector<int> joined(st.joining.begin(), st.joining.end());
  const auto r = planning::reconfigure(ctx, st.formed, lost, joined);
  if (r.action == planning::reconfiguration_action::checkpoint_and_stop)
    return checkpoint_and_stop(self, "cannot continue after losing node(s)" + [&] {
      std::string ids;
      for (int n : lost) ids += " " + std::to_string(n);
      return ids;
    }() + ": " + r.reason);
  const planning::epoch ep = planning::map_epoch(st.templates, r);
  std::vector<std::int64_t> live;
  for (const auto& p : r.pipelines) for (int n : p.nodes) live.push_back(n);
  for (int n : r.idle_nodes) live.push_back(n);
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  // Nodes alive but outside the new configuration (none today: the policy keeps every survivor)
  // still learn the epoch, so they leave the old one.
  for (std::int64_t id : live_nodes(st))
    if (!std::binary_search(live.begin(), live.end(), id)) live.insert(std::upper_bound(live.begin(), live.end(), id), id);
  ++st.reconfigurations;
  st.forming = {r.pipelines, r.idle_nodes};
  std::int64_t bytes = 0;
  for (const auto& c : r.copies) bytes += c.bytes;
  std::string rules;
  for (auto rule : r.rules) rules += std::string(rules.empty() ? "" : "+") + planning::to_string(rule);
  const double plan_ms = std::chrono::duration<double, std::milli>(st.deps.now() - started).count();
  send_epoch(self, ep, live);
  // One record per recovery, from the last commit to the next: a second reconfiguration before
  // that commit merges into it (every node lost or joined, every action, every byte copied).
  reconfiguration_record rec = st.recovering.value_or(reconfiguration_record{});
  const bool first = !st.recovering;
  rec.epoch = st.epoch;
  for (int n : lost)
    if (std::find(rec.lost.begin(), rec.lost.end(), n) == rec.lost.end()) rec.lost.push_back(n);
  for (int n : joined)
    if (std::find(rec.joined.begin(), rec.joined.end(), n) == rec.joined.end()) rec.joined.push_back(n);
  // The policy's decisions, in order; an epoch formed again unchanged (a failed step whose cause
  // was not known yet) is not a decision and only shows when nothing else happened.
  const std::string action = rules.empty() ? "unchanged" : rules;
  if (first || rec.action == "unchanged")
    rec.action = action;
  else if (action != "unchanged")
    rec.action += "," + action;
  if (first) rec.detect_ms = detect_ms;  // the first failure's
  rec.plan_ms += plan_ms;
  rec.copy_bytes += bytes;
  rec.resumed_step = st.step;
  st.recovering = rec;
  auto list = [](const std::vector<int>& ids) {
    std::string out;
    for (int n : ids) out += " " + std::to_string(n);
    return out;
  };
  std::string what = !lost.empty() ? "reconfigured after losing node(s)" + list(lost)
                     : !joined.empty() ? "reconfigured to admit node(s)" + list(joined)
                                       : std::string("re-formed the epoch");
  if (!lost.empty() && !joined.empty()) what += " and admitting node(s)" + list(joined);
  st.deps.log(what + " (" + rules + ", " + std::to_string(plan_ms) + " ms): epoch " + std::to_string(st.epoch) + ", " +
              std::to_string(st.pipelines.size()) + " pipeline(s), " + std::to_string(r.copies.size()) +
              " layer copies (" + std::to_string(bytes) + " bytes); step " + std::to_string(st.step) +
              (lost.empty() && !joined.empty() ? " is next" : " runs again"));
  job_event forming{event_kind::epoch_forming, st.epoch, st.step, -1, 0, rules};
  forming.lost.assign(lost.begin(), lost.end());
  forming.joined.assign(joined.begin(), joined.end());
  publish(self, forming);
}

void on_node_ready(coordinator_pointer self, node_ready& r) {
  auto& st = self->state;
  if (r.epoch != st.epoch || st.job_state != "forming") {
    ++st.dropped;
    return;
  }
  st.ready[r.node] = std::move(r.stages);
  st.ready_timing[r.node] = r.timing;
  for (std::int64_t id : st.in_epoch)
    if (!st.ready.count(id)) return;
  start_training(self);
}

namespace {

/// A step or an epoch failed without a node being declared lost (yet): often the data plane saw a
/// peer's crash before CAF's down message arrived; sometimes a real stage error. The epoch is
/// formed again on the same nodes (a dead one then never reports ready, and its loss, when it
/// arrives, starts the recovery over); a failure that repeats without any loss stops the job.
void retry_epoch(coordinator_pointer self, const std::string& what, std::int64_t failed_node) {
  auto& st = self->state;
  publish(self, {event_kind::step_failed, st.epoch, st.step, failed_node, 0, what});
  if (++st.failures_without_loss > coordinator_state::max_failures_without_loss)
    return stop_job(self, stop_outcome::failed,
                    what + " (" + std::to_string(st.failures_without_loss) + " failures in a row without a lost node)");
  st.deps.log(what + "; forming the epoch again");
  recover(self, std::nullopt);
}

}  // namespace

void on_node_fault(coordinator_pointer self, node_fault& f) {
  auto& st = self->state;
  // While a checkpoint is written no step runs: a fault is a survivor failing to form an epoch
  // that was aborted already (the stop's), nothing to recover from.
  if (f.epoch != st.epoch || st.job_state == "checkpointing") {
    ++st.dropped;
    return;
  }
  retry_epoch(self, "node " + std::to_string(f.node) + " failed in epoch " + std::to_string(f.epoch) + ": " + f.what, f.node);
}

void on_pipeline_done(coordinator_pointer self, pipeline_done& d) {
  auto& st = self->state;
  if (d.epoch != st.epoch || d.step != st.step || st.job_state != "training") {
    ++st.dropped;
    return;
  }
  if (!d.error.empty())
    return retry_epoch(self, "step " + std::to_string(d.step) + " failed in pipeline " + std::to_string(d.pipeline) +
                                 ": " + d.error, -1);
  st.loss_sum += d.loss_sum;
  st.timing.on_pipeline_done(d, st.deps.now());
  if (--st.pipelines_pending > 0) return;
  // Every pipeline reported: the step is committed, everywhere, now.
  st.job_state = "committing";
  st.commits_pending.clear();
  for (std::int64_t id : st.in_epoch) {
    st.commits_pending[id] = true;
    self->send(st.nodes.at(id).monitor, commit_step{st.epoch, st.step});
  }
}

namespace {

/// Closes the record of the step being committed: its loss, samples, pipelines and the digests
/// received (all of them, or those of the survivors when a node was lost during the commit),
/// prints the progress line, checks the replicas and reports the record.
void record_committed_step(coordinator_pointer self, const std::string& note) {
  auto& st = self->state;
  auto& rec = st.record;
  const std::int64_t microbatches = st.deps.job.global_batch / st.deps.job.microbatch;
  rec.loss = st.loss_sum / static_cast<double>(microbatches);
  rec.samples = st.deps.job.global_batch;
  const auto now = st.deps.now();
  rec.wall_ms = std::chrono::duration<double, std::milli>(now - st.step_started).count();
  rec.breakdown = st.timing.finish(now);
  rec.pipelines.clear();
  for (const auto& p : st.pipelines) rec.pipelines.push_back({p.nodes, p.microbatches});
  std::string mismatch;
  for (const auto& [layer, digests] : rec.layer_digests)
    if (std::adjacent_find(digests.begin(), digests.end(), std::not_equal_to<>()) != digests.end())
      mismatch += " " + std::to_string(layer);
  st.last_loss = rec.loss;
  st.samples_per_second = rec.wall_ms > 0 ? 1000.0 * rec.samples / rec.wall_ms : 0;
  ++st.committed;
  std::ostringstream line;
  line.precision(4);
  line << "step " << st.step << ": loss " << rec.loss << ", " << std::fixed;
  line.precision(1);
  line << st.samples_per_second << " samples/s, " << rec.wall_ms << " ms, " << st.pipelines.size()
       << " pipeline(s), epoch " << st.epoch << note;
  st.deps.log(line.str());
  if (!mismatch.empty())
    st.deps.log("ERROR: replicas of layer(s)" + mismatch + " disagree after step " + std::to_string(st.step));
  st.deps.on_step(rec);
  publish(self, {event_kind::step_committed, st.epoch, st.step, -1, rec.loss, {}});
  ++st.step;
}

}  // namespace

void on_step_committed(coordinator_pointer self, step_committed& c) {
  auto& st = self->state;
  if (c.epoch != st.epoch || c.step != st.step || st.job_state != "committing" || !st.commits_pending.count(c.node)) {
    ++st.dropped;
    return;
  }
  st.commits_pending.erase(c.node);
  st.timing.on_step_committed(c);
  for (const auto& d : c.digests) st.record.layer_digests[d.layer].push_back(d.digest);
  if (!st.commits_pending.empty()) return;

  const std::uint64_t committed_step = st.step;
  record_committed_step(self, "");
  st.failures_without_loss = 0;
  if (st.recovering) {
    st.recovering->downtime_ms = std::chrono::duration<double, std::milli>(st.deps.now() - st.last_commit).count();
    st.deps.log("back to training: step " + std::to_string(committed_step) + " committed " +
                std::to_string(static_cast<long long>(st.recovering->downtime_ms)) +
                " ms after the last commit before the reconfiguration");
    st.deps.on_reconfigured(*st.recovering);
    st.recovering.reset();
  }
  st.last_commit = st.deps.now();
  if (maybe_periodic_checkpoint(self)) return;  // after_commit once it is written
  after_commit(self);
}

void after_commit(coordinator_pointer self) {
  auto& st = self->state;
  if (st.step >= st.deps.steps) {
    st.deps.log("training finished: " + std::to_string(st.committed) + " step(s) committed");
    return stop_job(self, stop_outcome::finished, "training finished");
  }
  st.job_state = "training";
  // Nodes that registered during the step enter now, at the step boundary.
  if (!st.joining.empty()) return recover(self, std::nullopt);
  run_step(self);
}

}  // namespace oobleck::actors
