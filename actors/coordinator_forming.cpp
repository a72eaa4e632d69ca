#include "actors/coordinator_training.hpp"

#include <algorithm>
#include <optional>
#include <sstream>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/coordinator_checkpoint.hpp"
#include "actors/pipeline.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

std::vector<node_id> live_nodes(const coordinator_state& st) {
  std::vector<node_id> out;
  for (const auto& [id, n] : st.nodes)
    if (n.state != node_state::lost) out.push_back(id);
  return out;
}

messages::stage_assignment to_message(const planning::stage_assignment& s, const planning::epoch& ep) {
  const auto& ranks = ep.pipelines().at(static_cast<std::size_t>(s.pipeline)).ranks;
  return {s.pipeline,
          s.stage,
          s.num_stages,
          s.first_layer,
          s.end_layer,
          s.prev.value_or(planning::no_rank),
          s.next.value_or(planning::no_rank),
          s.gpus,
          ranks.front(),
          ranks.back()};
}

std::string id_list(const std::vector<node_id>& ids) {
  std::string out;
  for (auto n : ids) out += " " + std::to_string(n.value);
  return out;
}

/// -> forming: sends every node in `live` its part of `ep` (the epoch after st.epoch), which runs
/// `configuration`.
void send_epoch(coordinator_pointer self, const planning::epoch& ep, const std::vector<node_id>& live,
                planning::cluster_state configuration, std::int64_t copy_bytes) {
  auto& st = self->state;
  // The NCCL data plane's id for the epoch, drawn before anything changes: a failure to draw one
  // (NCCL's bootstrap found no interface) stops the job, saying why.
  std::vector<std::uint8_t> nccl_id;
  if (st.deps.new_nccl_id) {
    try {
      nccl_id = st.deps.new_nccl_id();
    } catch (const std::exception& e) {
      stop_job(self, stop_outcome::failed, std::string("cannot draw the epoch's NCCL id: ") + e.what());
      return;
    }
    if (nccl_id.empty()) {
      stop_job(self, stop_outcome::failed, "cannot draw the epoch's NCCL id: it came back empty");
      return;
    }
  }
  ++st.epoch;
  for (auto& p : st.current.pipelines)
    if (p.actor) self->send_exit(p.actor, caf::exit_reason::user_shutdown);
  st.current = {};
  st.current.nodes = live;
  st.current.stages.assign(ep.pipelines().size(), {});
  std::int32_t first = 0;
  for (std::size_t i = 0; i < ep.pipelines().size(); ++i) {
    running_pipeline p;
    for (auto r : ep.pipelines()[i].ranks) p.nodes.push_back(ep.node(r));
    p.first_microbatch = first;
    p.microbatches = ep.pipelines()[i].microbatches;
    first += p.microbatches;
    st.current.pipelines.push_back(std::move(p));
  }
  enter(self, phase::forming{std::move(configuration), {}, {}, st.deps.now()});

  epoch_assignment base;
  base.epoch = st.epoch;
  base.next_step = st.step;
  for (int r = 0; r < ep.num_ranks(); ++r) base.peers.push_back(st.nodes.at(ep.node(rank{r})).data);
  for (int l = 0; l < ep.num_layers(); ++l) base.layer_groups.push_back(ep.holders(layer_index{l}));
  for (const auto& c : ep.copies()) base.copies.push_back({c.layer, c.from, c.to});
  for (const auto& p : st.current.pipelines) base.pipeline_microbatches.push_back(p.microbatches);
  // A resumed job's layers come from its checkpoint until an epoch has formed everywhere.
  if (!st.formed_once) base.resume_dir = st.deps.checkpoint.resume_dir;
  base.data_nonce = random_hex(32);  // the data plane's handshake proves the token over it
  base.term = st.term;
  base.job_nodes = static_cast<std::int32_t>(live.size());
  for (int r = 0; r < ep.num_ranks(); ++r) base.rank_nodes.push_back(ep.node(rank{r}).value);
  if (!nccl_id.empty())
    for (const auto& l : planning::p2p_links(ep)) base.p2p_links.push_back({l.from, l.to});
  base.nccl_id = std::move(nccl_id);

  for (node_id id : live) {
    epoch_assignment a = base;
    if (auto r = ep.rank_of(id)) {
      a.rank = *r;
      const auto& stages = ep.stages(*r);
      for (std::size_t k = 0; k < stages.size(); ++k) {
        a.stages.push_back(to_message(stages[k], ep));
        auto& bounds = st.current.pipelines.at(static_cast<std::size_t>(stages[k].pipeline)).stage_layers;
        bounds.resize(static_cast<std::size_t>(stages[k].num_stages) + 1, 0);
        bounds[static_cast<std::size_t>(stages[k].stage)] = stages[k].first_layer.value;
        bounds[static_cast<std::size_t>(stages[k].stage) + 1] = stages[k].end_layer.value;
        auto& slots = st.current.stages.at(static_cast<std::size_t>(stages[k].pipeline));
        slots.resize(std::max<std::size_t>(slots.size(), static_cast<std::size_t>(stages[k].stage) + 1));
        slots[static_cast<std::size_t>(stages[k].stage)] = {id, static_cast<std::int32_t>(k)};
      }
    }
    self->send(st.nodes.at(id).monitor, std::move(a));
  }
  arm_form_deadline(self, copy_bytes);
}

/// forming -> training: every node formed the epoch; its configuration is where the layers are now.
void start_training(coordinator_pointer self, phase::forming& ph) {
  auto& st = self->state;
  st.formed_once = true;
  st.formed = ph.configuration;
  st.first_step_of_epoch = st.step;
  st.lost_since_formed.clear();
  // The joining nodes this epoch was planned with are in; one that registered while it formed
  // is not, and enters at the next step boundary.
  std::erase_if(st.joining, [&](node_id id) {
    const auto in = [id](const std::vector<node_id>& nodes) {
      return std::find(nodes.begin(), nodes.end(), id) != nodes.end();
    };
    bool planned = in(st.formed.idle_nodes);
    for (const auto& p : st.formed.pipelines) planned = planned || in(p.nodes);
    if (planned) st.nodes.at(id).state = node_state::registered;
    return planned;
  });
  if (st.recovering) {
    auto& rec = *st.recovering;
    rec.form_ms = ms_between(ph.assignments_sent, st.deps.now());
    rec.copy_ms = rec.copy_wait_ms = rec.connect_ms = rec.prepare_ms = rec.views_ms = 0;
    for (const auto& [node, t] : ph.timing) {
      rec.copy_ms = std::max(rec.copy_ms, static_cast<double>(t.copies_us) / 1000);
      rec.copy_wait_ms = std::max(rec.copy_wait_ms, static_cast<double>(t.copy_wait_us) / 1000);
      rec.prepare_ms = std::max(rec.prepare_ms, static_cast<double>(t.prepare_us) / 1000);
      rec.connect_ms = std::max(rec.connect_ms, static_cast<double>(t.connect_us) / 1000);
      rec.views_ms = std::max(rec.views_ms, static_cast<double>(t.views_us) / 1000);
    }
  } else {
    st.last_commit = st.deps.now();  // the job's first epoch: downtime counts from here
  }
  for (std::size_t i = 0; i < st.current.pipelines.size(); ++i) {
    pipeline_deps d;
    d.epoch = st.epoch;
    d.index = static_cast<std::int32_t>(i);
    d.first_microbatch = st.current.pipelines[i].first_microbatch;
    d.microbatches = st.current.pipelines[i].microbatches;
    d.coordinator = self;
    for (const auto& [node, index] : st.current.stages[i])
      d.stages.push_back(caf::actor_cast<stage_actor>(ph.ready.at(node).at(static_cast<std::size_t>(index))));
    st.current.pipelines[i].actor = self->spawn(pipeline, std::move(d));
  }
  std::ostringstream shape;
  for (std::size_t i = 0; i < st.current.pipelines.size(); ++i)
    shape << (i ? ", " : "") << st.current.stages[i].size() << " stage(s) x " << st.current.pipelines[i].microbatches
          << " microbatch(es)";
  st.deps.log("epoch " + std::to_string(st.epoch) + " formed: " + std::to_string(st.current.pipelines.size()) +
              " pipeline(s): " + shape.str());
  publish(self, {event_kind::epoch_formed, st.epoch, st.step, -1, 0, shape.str()});
  run_step(self);  // `ph` is gone from here on
}

std::string rules_of(const planning::reconfiguration& r) {
  std::string rules;
  for (auto rule : r.rules) rules += std::string(rules.empty() ? "" : "+") + planning::to_string(rule);
  return rules;
}

/// Folds one reconfiguration into the record of the recovery in progress: one record per recovery,
/// from the last commit to the next; a second reconfiguration before that commit merges into it
/// (every node lost or joined, every action, every byte copied).
void record_reconfiguration(coordinator_pointer self, const planning::reconfiguration& r,
                            const std::vector<node_id>& lost, const std::vector<node_id>& joined,
                            double detect_ms, double plan_ms) {
  auto& st = self->state;
  reconfiguration_record rec = st.recovering.value_or(reconfiguration_record{});
  const bool first = !st.recovering;
  rec.epoch = st.epoch;
  for (auto n : lost)
    if (std::find(rec.lost.begin(), rec.lost.end(), n) == rec.lost.end()) rec.lost.push_back(n);
  for (auto n : joined)
    if (std::find(rec.joined.begin(), rec.joined.end(), n) == rec.joined.end()) rec.joined.push_back(n);
  // The policy's decisions, in order; an epoch formed again unchanged (a failed step whose cause
  // was not known yet) is not a decision and only shows when nothing else happened.
  const std::string rules = rules_of(r);
  const std::string action = rules.empty() ? "unchanged" : rules;
  if (first || rec.action == "unchanged")
    rec.action = action;
  else if (action != "unchanged")
    rec.action += "," + action;
  if (first) rec.detect_ms = detect_ms;  // the first failure's
  rec.plan_ms += plan_ms;
  for (const auto& c : r.copies) rec.copy_bytes += c.bytes;
  rec.resumed_step = st.step;
  st.recovering = rec;
}

bool node_failed(coordinator_pointer self, node_fault& f) {
  auto& st = self->state;
  // No node is in an epoch this coordinator has not assigned yet: dropped, not a strike.
  if (f.epoch > st.epoch) return false;
  if (own_failure(self, f)) return true;  // evicted: the recovery is under way
  if (f.epoch != st.epoch) return f.own && f.epoch >= st.commit_epoch;  // counted as a strike
  on_retry(self, to_string(f.node) + " failed in epoch " + std::to_string(f.epoch) + ": " + f.what, f.node, f.own);
  return true;
}

}  // namespace

planning::reconfiguration reconfigure_now(const coordinator_state& st) {
  const planning::layer_costs costs(st.deps.profile, planning::job_memory(st.deps.profile, st.deps.job));
  const planning::reconfiguration_context ctx{st.templates, costs, st.deps.job.fault_tolerance,
                                              st.deps.job.global_batch / st.deps.job.microbatch,
                                              st.deps.job.microbatch};
  return planning::reconfigure(ctx, st.formed, st.lost_since_formed, st.joining);
}

/// The shared step of every transition into `forming` after the first plan (a loss, a retry, a
/// join): the survivors leave the epoch in force; the job ends when a commit that stood was its
/// last step; otherwise the reconfiguration policy decides from the last
/// formed configuration (or says checkpoint and stop) and the new epoch is assigned.
void enter_forming(coordinator_pointer self, std::optional<node_id> lost_node) {
  auto& st = self->state;
  const std::string cause = lost_node ? to_string(*lost_node) + " was lost" : "the epoch failed";
  if (!st.formed_once) {
    // Nothing has trained yet, and no epoch has formed everywhere: plan the job afresh on the
    // survivors (every layer from its seed; there is nothing to copy).
    for (node_id id : st.current.nodes) {
      const auto& n = st.nodes.at(id);
      if (n.state != node_state::lost) self->send(n.monitor, abort_epoch{st.epoch, "re-planning before the first step"});
    }
    st.deps.log("node lost before the job's first epoch formed: planning the job again on the survivors");
    return plan_first_epoch(self);
  }
  for (node_id id : st.current.nodes) {
    const auto& n = st.nodes.at(id);
    if (n.state != node_state::lost) self->send(n.monitor, abort_epoch{st.epoch, cause});
  }
  if (st.step >= st.deps.steps) {
    st.deps.log("training finished: " + std::to_string(st.committed) + " step(s) committed");
    return stop_job(self, stop_outcome::finished, "training finished");
  }

  const auto started = st.deps.now();
  const double detect_ms = ms_between(st.step_started, started);
  // A node already known lost is never planned on, even when its loss is still being checked
  // (check_reachable) and a step failure re-forms the epoch first.
  note_formed_losses(st);
  const std::vector<node_id> lost = st.lost_since_formed, joined = st.joining;
  const auto r = reconfigure_now(st);
  if (r.action == planning::reconfiguration_action::checkpoint_and_stop)
    return checkpoint_and_stop(self, "cannot continue after losing node(s)" + id_list(lost) + ": " + r.reason);
  const planning::epoch ep = planning::map_epoch(st.templates, r);
  std::vector<node_id> live;
  for (const auto& p : r.pipelines) live.insert(live.end(), p.nodes.begin(), p.nodes.end());
  live.insert(live.end(), r.idle_nodes.begin(), r.idle_nodes.end());
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  // Nodes alive but outside the new configuration (none today: the policy keeps every survivor)
  // still learn the epoch, so they leave the old one.
  for (node_id id : live_nodes(st))
    if (!std::binary_search(live.begin(), live.end(), id)) live.insert(std::upper_bound(live.begin(), live.end(), id), id);
  std::int64_t bytes = 0;
  for (const auto& c : r.copies) bytes += c.bytes;
  const std::string rules = rules_of(r);
  const double plan_ms = ms_between(started, st.deps.now());
  send_epoch(self, ep, live, {r.pipelines, r.idle_nodes}, bytes);
  st.predicted_step_ms = r.step_ms;
  record_reconfiguration(self, r, lost, joined, detect_ms, plan_ms);
  std::string what = !lost.empty()     ? "reconfigured after losing node(s)" + id_list(lost)
                     : !joined.empty() ? "reconfigured to admit node(s)" + id_list(joined)
                                       : std::string("re-formed the epoch");
  if (!lost.empty() && !joined.empty()) what += " and admitting node(s)" + id_list(joined);
  st.deps.log(what + " (" + rules + ", " + std::to_string(plan_ms) + " ms): epoch " + std::to_string(st.epoch) + ", " +
              std::to_string(st.current.pipelines.size()) + " pipeline(s), " + std::to_string(r.copies.size()) +
              " layer copies (" + std::to_string(bytes) + " bytes); step " + std::to_string(st.step) +
              (lost.empty() && !joined.empty() ? " is next" : " runs again"));
  job_event forming{event_kind::epoch_forming, st.epoch, st.step, -1, 0, rules};
  forming.lost = planning::numbers(lost);
  forming.joined = planning::numbers(joined);
  publish(self, forming);
}

/// A step or an epoch failed without a node being declared lost (yet): often the data plane saw a
/// peer's crash before CAF's down message arrived; sometimes a real stage error. The epoch is
/// formed again on the same nodes (a dead one then never reports ready, and its loss, when it
/// arrives, starts the recovery over); a failure that repeats without any loss stops the job.
void on_retry(coordinator_pointer self, const std::string& what, std::optional<node_id> failed_node, bool published) {
  auto& st = self->state;
  if (!published)
    publish(self, {event_kind::step_failed, st.epoch, st.step, failed_node ? failed_node->value : -1, 0, what});
  if (!st.unhandled_losses.empty()) {
    // A loss is being checked (check_reachable): its handling re-forms the epoch, or, when every
    // node was lost at once, waits for them. The failure is its consequence; re-forming now would
    // plan as if this coordinator had not been cut off.
    st.deps.log(what + "; a node loss is being checked, which decides what comes next");
    return;
  }
  ++st.failures_without_loss;
  if (failures_stop_the_job(st))
    return stop_after_checkpoint(self, stop_outcome::failed,
                    what + " (" + std::to_string(st.failures_without_loss) + " failures in a row without a lost node)");
  st.deps.log(what + "; forming the epoch again");
  commit_stands_if_decided(self, std::nullopt);
  enter_forming(self, std::nullopt);
}

void plan_first_epoch(coordinator_pointer self) {
  auto& st = self->state;
  const auto live = live_nodes(st);
  planning::job_config job = st.deps.job;
  job.nodes = static_cast<int>(live.size());
  planning::job_plan plan;
  try {
    plan = planning::plan_job(st.deps.profile, job, live);
  } catch (const std::exception& e) {
    const std::string why = "cannot plan the job on " + std::to_string(live.size()) + " node(s): " + e.what();
    if (static_cast<std::int32_t>(live.size()) < st.deps.expected_nodes) {
      // Nodes lost before anything trained (while the first epoch formed, or a replacement's
      // nodes that had committed nothing): too few to plan is the policy's "checkpoint and stop"
      // (nothing trained to write: exit 4), or, in a job that waits for nodes, a wait for the
      // job's nodes as at its start. It is not the job's failure.
      if (!st.deps.wait_below_minimum) return checkpoint_and_stop(self, why);
      st.deps.log(why + "; waiting for nodes, as at the job's start (" + std::to_string(live.size()) + " of " +
                  std::to_string(st.deps.expected_nodes) + " admitted)");
      enter(self, phase::registering{});
      return;
    }
    return stop_job(self, stop_outcome::failed, why);
  }
  st.templates = plan.templates;
  st.formed = {plan.pipelines, plan.idle_nodes};
  st.lost_since_formed.clear();
  send_epoch(self, planning::map_epoch(plan), live, {plan.pipelines, plan.idle_nodes}, 0);
  st.predicted_step_ms = plan.step_ms;
  publish(self, {event_kind::epoch_forming, st.epoch, st.step, -1, 0, {}});
  st.deps.log("forming epoch " + std::to_string(st.epoch) + " on " + std::to_string(live.size()) + " node(s), " +
              std::to_string(st.current.pipelines.size()) + " pipeline(s), predicted step " +
              std::to_string(plan.step_ms) + " ms");
}

void on_loss(coordinator_pointer self, node_id node) {
  auto& st = self->state;
  if (auto* ck = std::get_if<phase::checkpointing>(&st.phase)) {
    if (ck->progress.stop_after) return fallback_writer_lost(self, *ck, node);
    abandon_periodic_checkpoint(self, *ck, to_string(node) + " was lost");
  }
  commit_stands_if_decided(self, node);
  st.lost_since_formed.push_back(node);
  st.failures_without_loss = 0;
  enter_forming(self, node);
}

bool handle(coordinator_pointer self, phase::forming& ph, node_ready& r) {
  auto& st = self->state;
  if (r.epoch != st.epoch) return false;
  ph.ready[r.node] = std::move(r.stages);
  ph.timing[r.node] = r.timing;
  for (node_id id : st.current.nodes)
    if (!ph.ready.count(id)) return true;
  start_training(self, ph);
  return true;
}

bool handle(coordinator_pointer self, phase::forming&, node_fault& f) { return node_failed(self, f); }
bool handle(coordinator_pointer self, phase::training&, node_fault& f) { return node_failed(self, f); }
bool handle(coordinator_pointer self, phase::committing& ph, node_fault& f) {
  auto& st = self->state;
  if (f.own && f.in_commit && f.epoch == st.epoch && st.current.contains(f.node)) {
    // Its commit failed part-way: its layers are neither the old state nor the new one. The commit
    // stands (it was decided); the node goes. (A failure of the next step, whose orders rode with
    // the commit, is a step's: a strike, below.)
    publish(self, {event_kind::step_failed, st.epoch, st.step, f.node.value, 0, f.what});
    evict(self, f.node, "applying the commit failed: " + f.what);
    return true;
  }
  if (ph.ahead && f.epoch == st.epoch && !f.in_commit) {
    // A failure of the step sent ahead: it waits for the commit's acknowledgements, which the
    // other nodes send before they run that step.
    ph.early_faults.push_back(std::move(f));
    return true;
  }
  return node_failed(self, f);
}

}  // namespace oobleck::actors
