// Coordinator loss (ARCHITECTURE.md §10 "Coordinator loss"): the state that matters lives on the
// workers. A worker whose coordinator went away keeps its layers (with their optimizer state at
// the last commit it applied) and the gradients of a step it finished, and registers again with
// what it kept (node_memory). A coordinator in `registering` that receives such a registration
// adopts the job: it waits for the nodes of the newest epoch (or a deadline), decides the job's
// committed step (a commit that reached any node was decided; nodes that did not apply it apply
// it now from the gradients they kept), checks that every layer has holders at that step whose
// digests agree, rebuilds the configuration that last formed from the nodes' roles, and goes on
// as after a loss: the reconfiguration policy plans the next epoch over the nodes present, and
// the step after the committed one runs with its own samples.

#include <algorithm>
#include <set>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/coordinator_checkpoint.hpp"
#include "actors/coordinator_training.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

void arm_adopt_deadline(coordinator_pointer self, phase::adopting& ph, double ms) {
  const auto delay = std::chrono::microseconds(static_cast<std::int64_t>(std::max(1.0, ms) * 1000));
  self->delayed_send(caf::actor_cast<coordinator_actor>(self), delay,
                     coordinator_deadline{deadline_kind::adopt, 0, 0, ++ph.round});
}

const node_role* role_in(const node_memory& m, std::uint64_t epoch) {
  for (const auto& r : m.roles)
    if (r.epoch == epoch) return &r;
  return nullptr;
}

/// The adoption is over: the registry, the last formed configuration and the counters are the
/// nodes' state; the policy plans the next epoch as after a loss.
void finish_adoption(coordinator_pointer self, phase::adopting& ph) {
  auto& st = self->state;
  const std::int64_t k = ph.committed_step;
  const std::uint64_t e_k = ph.committed_epoch;
  // The update count of a layer at step k: every layer a node at k holds in its stages has it.
  std::int64_t updates_k = 0;
  for (const auto& [id, m] : ph.memories)
    if (m.committed_step == k)
      for (const auto& l : m.layers) updates_k = std::max(updates_k, l.updates);
  std::map<int, std::vector<std::pair<node_id, std::uint64_t>>> holders;
  std::set<node_id> at_k;
  for (const auto& [id, m] : ph.memories) {
    if (m.committed_step != k) continue;
    at_k.insert(id);
    for (const auto& l : m.layers)
      if (l.updates == updates_k) holders[l.layer.value].push_back({id, l.digest});
  }
  for (const auto& [id, digests] : ph.completed) {
    at_k.insert(id);
    for (const auto& d : digests) holders[d.layer.value].push_back({id, d.digest});
  }
  // The nodes' last commit, in this clock: each memory says how long before its arrival it was;
  // the latest estimate is the closest (every node at step K applied it at about the same time).
  auto before = ph.started - std::chrono::hours(24);
  for (const auto& [id, m] : ph.memories)
    if (const auto at = ph.arrived.find(id); at != ph.arrived.end() && m.committed_step == k)
      before = std::max(before, at->second - std::chrono::milliseconds(m.ms_since_commit));
  if (before > st.deps.now()) before = st.deps.now();
  std::string unreconciled;
  for (int l = 0; l < st.deps.profile.num_layers() && unreconciled.empty(); ++l) {
    const auto& h = holders[l];
    if (h.empty()) {
      unreconciled = "no node holds layer " + std::to_string(l) + " at step " + std::to_string(k);
      continue;
    }
    for (const auto& [node, digest] : h)
      if (digest != h.front().second)
        unreconciled = "the holders of layer " + std::to_string(l) + " disagree at step " + std::to_string(k) + " (" +
                       to_string(h.front().first) + " and " + to_string(node) + ")";
  }
  if (!unreconciled.empty()) {
    std::string latest;
    try {
      latest = st.deps.checkpoint.latest ? st.deps.checkpoint.latest() : std::string();
    } catch (const std::exception& e) {
      st.deps.log(std::string("cannot list the checkpoints: ") + e.what());
    }
    const auto step = latest.empty() ? std::nullopt : checkpoint_step_of(latest);
    if (!step)
      return stop_job(self, stop_outcome::failed,
                      "cannot adopt the job from its nodes' memory: " + unreconciled +
                          (latest.empty() ? "; no checkpoint to fall back to"
                                          : "; resume from the newest checkpoint: " +
                                                st.deps.checkpoint.resume_command(latest)));
    // The nodes' memory cannot be trusted as the job's state; the newest checkpoint can: the job
    // goes on from it (the steps after it run again, on the same trajectory).
    st.deps.log("cannot adopt the job from its nodes' memory: " + unreconciled + "; falling back to the newest checkpoint, " +
                latest + " (step " + std::to_string(*step) + ")");
    for (const auto& [id, m] : ph.memories) self->send(st.nodes.at(id).monitor, abort_epoch{st.epoch, "resuming from a checkpoint"});
    st.restoring = restore_record{st.term, live_count_of(st), *step, 0, 0};
    st.last_commit = before;
    return resume_or_wait_from_checkpoint(self, latest, *step, "the nodes that came back do not hold every layer");
  }

  // The configuration that formed last (the committed epoch's), in this coordinator's ids; nodes of
  // it that did not come back get ids of their own and are lost.
  // Ids in e_K's roles are those of the coordinator that assigned e_K: each node says its own then.
  std::map<std::int64_t, node_id> ek_ids;
  for (const auto& [id, m] : ph.memories)
    if (const node_role* role = role_in(m, e_k); role && role->self >= 0) ek_ids[role->self] = id;
  std::map<std::int64_t, node_id> ghosts;
  auto now_id = [&](std::int64_t old) {
    if (auto it = ek_ids.find(old); it != ek_ids.end()) return it->second;
    if (auto it = ghosts.find(old); it != ghosts.end()) return it->second;
    const node_id ghost = st.next_node;
    st.next_node = node_id{ghost.value + 1};
    node_entry entry;
    entry.name = "node " + std::to_string(old) + " (not back)";
    entry.slots = st.deps.policy.slots_per_node;
    entry.state = node_state::lost;
    entry.lost_reason = "did not come back to the replacement coordinator";
    st.nodes[ghost] = std::move(entry);
    st.lost_order.push_back(ghost);
    ghosts[old] = ghost;
    return ghost;
  };
  std::map<int, std::vector<node_id>> pipelines;
  planning::cluster_state formed;
  std::vector<node_id> stale;
  for (const auto& [id, m] : ph.memories) {
    const node_role* role = at_k.count(id) ? role_in(m, e_k) : nullptr;
    if (!role) {
      stale.push_back(id);
      continue;
    }
    if (role->pipeline < 0) {
      formed.idle_nodes.push_back(id);
    } else if (!pipelines.count(role->pipeline)) {
      auto& nodes = pipelines[role->pipeline];
      for (auto old : role->nodes) nodes.push_back(now_id(old));
    }
  }
  for (auto& [index, nodes] : pipelines)
    formed.pipelines.push_back({nodes, static_cast<int>(nodes.size()), 0, 0});
  std::vector<node_id> lost;
  for (const auto& [old, ghost] : ghosts) lost.push_back(ghost);
  for (node_id id : stale) {
    st.nodes.at(id).state = node_state::joining;
    st.joining.push_back(id);
  }
  std::vector<node_id> everyone;
  for (const auto& p : formed.pipelines) everyone.insert(everyone.end(), p.nodes.begin(), p.nodes.end());
  everyone.insert(everyone.end(), formed.idle_nodes.begin(), formed.idle_nodes.end());
  everyone.insert(everyone.end(), st.joining.begin(), st.joining.end());
  std::sort(everyone.begin(), everyone.end());
  everyone.erase(std::unique(everyone.begin(), everyone.end()), everyone.end());
  planning::job_config job = st.deps.job;
  job.nodes = static_cast<int>(everyone.size());
  try {
    st.templates = planning::plan_job(st.deps.profile, job, everyone).templates;
  } catch (const std::exception& e) {
    return stop_job(self, stop_outcome::failed,
                    "cannot plan the adopted job on " + std::to_string(everyone.size()) + " node(s): " + e.what());
  }

  // The commit this coordinator was confirming when it lost every node, applied (step k): its
  // record is written now, as for a commit that stood through a loss.
  if (ph.decided && ph.decided->record.step == static_cast<std::uint64_t>(k) && st.step == static_cast<std::uint64_t>(k))
    record_stood_commit(self, *ph.decided, "this coordinator lost every node", std::nullopt);
  ph.decided.reset();
  st.formed = std::move(formed);
  st.formed_once = true;
  st.lost_since_formed = lost;
  st.step = static_cast<std::uint64_t>(k + 1);
  st.committed = static_cast<std::uint64_t>(k + 1);
  st.commit_epoch = e_k;
  st.last_commit = before;
  st.step_started = before;
  st.failures_without_loss = 0;
  st.restoring = restore_record{st.term, live_count_of(st), st.step, static_cast<std::int32_t>(ph.completed.size()), 0};
  st.deps.log("adopted the job (term " + std::to_string(st.term) + "): " + std::to_string(at_k.size()) +
              " node(s) at step " + std::to_string(k) + " (" + std::to_string(ph.completed.size()) +
              " applied its commit from their kept gradients), " + std::to_string(lost.size()) + " not back, " +
              std::to_string(st.joining.size()) + " to admit; step " + std::to_string(st.step) + " is next");
  enter_forming(self, std::nullopt);
}

/// The nodes are in (or the wait is over): the newest commit any node applied was decided; nodes
/// that finished that step's gradients but did not apply it apply it now.
void decide(coordinator_pointer self, phase::adopting& ph) {
  auto& st = self->state;
  ph.deciding = true;
  std::int64_t k = -1;
  double scale = 1;
  for (const auto& [id, m] : ph.memories) {
    st.epoch = std::max({st.epoch, m.epoch, m.views_epoch});
    if (m.committed_step > k) {
      k = m.committed_step;
      ph.committed_epoch = m.committed_epoch;
      scale = m.grad_scale;
    }
  }
  ph.committed_step = k;
  if (k < 0) {
    // Nothing was committed anywhere: the job starts again from its beginning (layers from their
    // seed, or from the checkpoint it resumed from).
    for (const auto& entry : ph.memories)
      self->send(st.nodes.at(entry.first).monitor, abort_epoch{st.epoch, "the job is planned afresh"});
    // Too few to plan the job: plan_first_epoch stops it as the policy's "checkpoint and stop",
    // or, in a job that waits for nodes, waits for them as at its start.
    st.deps.log("the adopted nodes committed no step yet: planning the job afresh");
    return plan_first_epoch(self);
  }
  for (const auto& [id, m] : ph.memories) {
    if (m.committed_step == k - 1 && m.epoch == ph.committed_epoch && m.views_epoch == ph.committed_epoch &&
        m.gradients_step == k) {
      self->send(st.nodes.at(id).monitor, commit_step{ph.committed_epoch, static_cast<std::uint64_t>(k), scale});
      ph.completing.insert(id);
    }
  }
  if (ph.completing.empty()) return finish_adoption(self, ph);
  st.deps.log("step " + std::to_string(k) + " was committed on some nodes: " + std::to_string(ph.completing.size()) +
              " apply it now from the gradients they kept");
  arm_adopt_deadline(self, ph, form_deadline_ms(st, 0));
}

}  // namespace

std::int32_t live_count_of(const coordinator_state& st) {
  std::int32_t n = 0;
  for (const auto& [id, e] : st.nodes)
    if (e.state != node_state::lost) ++n;
  return n;
}

void mark_lost(coordinator_pointer self, node_id id, std::string reason) {
  auto& st = self->state;
  auto& n = st.nodes.at(id);
  n.state = node_state::lost;
  n.lost_reason = std::move(reason);
  st.lost_order.push_back(id);
  st.deps.log(to_string(id) + " lost: " + n.name + " (" + n.lost_reason + ")");
  publish(self, {event_kind::node_lost, st.epoch, st.step, id.value, 0, n.lost_reason});
  std::erase(st.joining, id);
}

bool every_live_node_lost_us(const coordinator_state& st) {
  bool any = false;
  for (const auto& [id, n] : st.nodes) {
    if (n.state == node_state::lost) continue;
    if (!st.lost_us.count(id)) return false;
    any = true;
  }
  return any;
}

void handle_losses(coordinator_pointer self) {
  auto& st = self->state;
  auto losses = std::exchange(st.unhandled_losses, {});
  if (std::holds_alternative<phase::stopped>(st.phase) || std::holds_alternative<phase::adopting>(st.phase)) return;
  auto* ck = std::get_if<phase::checkpointing>(&st.phase);
  const bool fallback = ck && ck->progress.stop_after;
  const bool cut_off = live_count_of(st) == 0 || every_live_node_lost_us(st);
  // Before the first epoch formed too: the nodes come back with nothing committed, and the job is
  // planned afresh over them (decide()).
  if (cut_off && !fallback) {
    // Every node at once: this coordinator was frozen or cut off, not they. They keep their state
    // and look for a coordinator; it waits for them rather than concluding "too few nodes".
    // A commit being confirmed may have reached some nodes or none: their memories decide. If any
    // applied it, it was decided and stands (the others apply it from their kept gradients), and
    // its record, which only this coordinator has, is written then; else the step runs again.
    // Nodes whose loss it has not seen yet but that said they lost it too (they reached it again
    // before it woke: seen after a 7 s freeze in a chaos run) are lost as the others are, and come
    // back with their state as they do.
    std::optional<step_progress> decided;
    if (auto* c = std::get_if<phase::committing>(&st.phase); c && !c->stood) decided = std::move(c->step);
    for (const auto& [id, n] : st.nodes)
      if (n.state != node_state::lost) mark_lost(self, id, "it lost contact with this coordinator");
    st.lost_us.clear();
    if (ck) abandon_periodic_checkpoint(self, *ck, "every node was lost");
    st.deps.log("every node was lost at once: this coordinator was frozen or cut off; waiting up to " +
                std::to_string(static_cast<long long>(st.deps.grace_ms / 1000)) +
                " s for them to come back with their state");
    phase::adopting next;
    next.started = st.deps.now();
    next.waiting = true;
    next.decided = std::move(decided);
    auto& ph = enter(self, std::move(next));
    arm_adopt_deadline(self, ph, st.deps.grace_ms);
    return;
  }
  for (node_id node : losses) {
    // Stopped, or waiting for the job's nodes as at its start (nothing trained yet): no epoch to recover.
    if (std::holds_alternative<phase::stopped>(st.phase) || std::holds_alternative<phase::registering>(st.phase)) return;
    // An earlier loss of the batch may have left the job waiting for nodes (below its minimum).
    if (auto* waiting = std::get_if<phase::waiting>(&st.phase)) waiting_lost(self, *waiting, node);
    else if (st.current.contains(node)) on_loss(self, node);
  }
}

caf::result<admission> adopt_node(coordinator_pointer self, register_node& r, monitor_actor monitor) {
  auto& st = self->state;
  const auto& m = r.memory;
  node_id id = st.next_node;
  if (m.node >= 0 && !st.nodes.count(node_id{m.node})) id = node_id{m.node};
  st.next_node = node_id{std::max(st.next_node.value, id.value + 1)};
  self->monitor(monitor);
  st.nodes[id] = node_entry{r.name, r.slots, r.data, monitor, node_state::registered, {}, r.device_index};
  if (std::holds_alternative<phase::registering>(st.phase)) {
    phase::adopting next;
    next.started = st.deps.now();
    auto& ph = enter(self, std::move(next));
    st.deps.log("a node came back with the state of a job in progress: adopting the job (waiting up to " +
                std::to_string(static_cast<long long>(st.deps.adopt_wait_ms)) + " ms for its nodes)");
    arm_adopt_deadline(self, ph, st.deps.adopt_wait_ms);
  }
  auto& ph = std::get<phase::adopting>(st.phase);
  if (ph.waiting && ph.memories.empty()) arm_adopt_deadline(self, ph, st.deps.adopt_wait_ms);  // the first is back
  ph.memories[id] = m;
  ph.arrived[id] = st.deps.now();
  ph.expected = std::max(ph.expected, m.job_nodes);
  st.term = std::max(st.term, m.term + 1);
  st.deps.log(to_string(id) + " came back: " + r.name + " (was node " + std::to_string(m.node) + " of term " +
              std::to_string(m.term) + ", last commit step " + std::to_string(m.committed_step) + ", " +
              std::to_string(m.layers.size()) + " layer(s))");
  publish(self, {event_kind::node_joined, st.epoch, st.step, id.value, 0, r.name});
  auto promise = self->make_response_promise<admission>();
  promise.deliver(admission{id, st.deps.job_toml, st.deps.policy.job_hash, st.term});
  if (!ph.deciding && static_cast<std::int32_t>(ph.memories.size()) >= ph.expected) decide(self, ph);
  return promise;
}

void superseded(coordinator_pointer self, std::uint64_t newer_term, const std::string& who) {
  auto& st = self->state;
  const std::string why = "a newer coordinator (term " + std::to_string(newer_term) + ") adopted the job; this one (term " +
                          std::to_string(st.term) + ") was replaced (" + who + " came back from it)";
  st.deps.log("stopping: " + why);
  enter(self, phase::stopped{stop_outcome::superseded, why});
  job_event e{event_kind::stopped, st.epoch, st.step, -1, st.last_loss, why};
  e.outcome = stop_outcome::superseded;
  e.committed = st.committed;
  publish(self, e);
  for (auto& p : st.current.pipelines)
    if (p.actor) self->send_exit(p.actor, caf::exit_reason::user_shutdown);
  self->quit(make_error(protocol_error::superseded, why));
}

void adoption_lost(coordinator_pointer self, phase::adopting& ph, node_id node) {
  ph.memories.erase(node);
  ph.arrived.erase(node);
  if (ph.deciding && ph.completing.erase(node) && ph.completing.empty()) finish_adoption(self, ph);
}

bool handle(coordinator_pointer self, phase::adopting& ph, step_committed& c) {
  if (!ph.deciding || c.epoch != ph.committed_epoch || static_cast<std::int64_t>(c.step) != ph.committed_step ||
      ph.completing.erase(c.node) == 0)
    return false;
  ph.completed[c.node] = c.digests;
  if (ph.completing.empty()) finish_adoption(self, ph);
  return true;
}

bool handle(coordinator_pointer self, phase::adopting& ph, coordinator_deadline& d) {
  if (d.kind != deadline_kind::adopt || d.probe != ph.round) return false;
  auto& st = self->state;
  if (!ph.deciding && ph.memories.empty()) {
    stop_job(self, stop_outcome::failed,
             "no node came back within " + std::to_string(static_cast<long long>(st.deps.grace_ms / 1000)) +
                 " s after every node was lost at once");
    return true;
  }
  if (!ph.deciding) {
    st.deps.log("adoption: " + std::to_string(ph.memories.size()) + " of " + std::to_string(ph.expected) +
                " node(s) came back in time; going on with them");
    decide(self, ph);
    return true;
  }
  for (node_id id : ph.completing) st.deps.log(to_string(id) + " did not apply the decided commit in time");
  ph.completing.clear();
  finish_adoption(self, ph);
  return true;
}

}  // namespace oobleck::actors
