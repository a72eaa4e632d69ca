// Stage faults (ARCHITECTURE.md §5 "Stage faults"): deadlines on steps, epochs and commits, the
// stall probe that names the culprit of a missed deadline, strikes and eviction. A node that fails
// (an exception in its own stage) or stalls (computes while its peers wait, past the deadline)
// is not lost: the epoch is formed again on the same nodes and the step runs again; only a node
// that does it again and again is evicted, so that a node that keeps running out of memory cannot
// stop a job that can go on without it.

#include <algorithm>
#include <memory>
#include <sstream>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/coordinator_gate.hpp"
#include "actors/coordinator_training.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

std::string ms_text(double ms) { return std::to_string(static_cast<long long>(ms)) + " ms"; }

void set_deadline(coordinator_pointer self, double ms, coordinator_deadline d) {
  const auto delay = std::chrono::microseconds(static_cast<std::int64_t>(std::max(1.0, ms) * 1000));
  self->delayed_send(caf::actor_cast<coordinator_actor>(self), delay, d);
}

/// Asks every node of the epoch in force what its stages are doing; the answers go into `round`
/// until the probe deadline.
probe_round start_probe(coordinator_pointer self, double deadline_ms) {
  auto& st = self->state;
  probe_round round{++st.probes, deadline_ms, {}};
  for (node_id id : st.current.nodes) {
    const auto& n = st.nodes.at(id);
    if (n.state != node_state::lost) self->send(n.monitor, stall_probe{st.epoch, round.id});
  }
  set_deadline(self, st.deps.faults.probe_ms, {deadline_kind::probe, st.epoch, st.step, round.id});
  return round;
}

bool probe_complete(const coordinator_state& st, const probe_round& round) {
  for (node_id id : st.current.nodes)
    if (st.nodes.at(id).state != node_state::lost && !round.reports.count(id)) return false;
  return true;
}

std::string id_text(const std::vector<node_id>& ids) {
  std::string out;
  for (auto id : ids) out += (out.empty() ? "" : ", ") + to_string(id);
  return out;
}

int stop_threshold(const coordinator_state& st) {
  return std::max({coordinator_state::max_failures_without_loss, st.deps.faults.evict_after_errors,
                   st.deps.faults.evict_after_stalls});
}

/// Strikes `culprits` (a stall each); evicts those that reached the limit, else forms the epoch
/// again. `what` says what happened.
void stalled(coordinator_pointer self, const std::vector<node_id>& culprits, const std::string& what) {
  auto& st = self->state;
  std::vector<node_id> evict_now;
  for (node_id id : culprits)
    if (++st.stalls[id] >= st.deps.faults.evict_after_stalls) evict_now.push_back(id);
  if (evict_now.empty())
    return on_retry(self, what, culprits.empty() ? std::nullopt : std::optional<node_id>(culprits.front()));
  publish(self, {event_kind::step_failed, st.epoch, st.step, evict_now.front().value, 0, what});
  st.deps.log(what);
  for (node_id id : evict_now)
    evict(self, id, "stalled " + std::to_string(st.stalls[id]) + " time(s) since the last commit");
}

/// The step's deadline passed and the probe is in (or its time is up): name the culprit.
void decide(coordinator_pointer self, phase::training& ph) {
  auto& st = self->state;
  const probe_round round = std::move(*ph.probing);
  ph.probing.reset();
  // The culprit computes while everyone else waits: the node with the longest computation under
  // way, when it has been computing for at least half the deadline (a healthy stage computes for
  // a fraction of a step). A node whose monitor did not answer is suspect too.
  std::optional<node_id> busiest;
  double longest = 0;
  std::vector<node_id> silent;
  for (node_id id : st.current.nodes) {
    if (st.nodes.at(id).state == node_state::lost) continue;
    const auto it = round.reports.find(id);
    if (it == round.reports.end()) {
      silent.push_back(id);
      continue;
    }
    const double c = it->second.computing_ms;
    if (c > longest) longest = c, busiest = id;
  }
  std::vector<node_id> culprits;
  std::ostringstream what;
  what << "step " << st.step << " did not finish within " << ms_text(round.deadline_ms);
  if (busiest && longest >= round.deadline_ms / 2) {
    culprits.push_back(*busiest);
    what << ": " << to_string(*busiest) << " has been computing for " << ms_text(longest) << " while its peers wait";
  } else if (!silent.empty()) {
    culprits = silent;
    what << ": " << id_text(silent) << " did not answer the stall probe";
  } else {
    what << "; no node is computing (a message lost?)";
  }
  stalled(self, culprits, what.str());
}

/// The epoch's forming deadline passed and the probe is in: the nodes that have not started
/// forming (their previous step still holds their stages) or did not answer are the culprits.
void decide(coordinator_pointer self, phase::forming& ph) {
  auto& st = self->state;
  const probe_round round = std::move(*ph.probing);
  ph.probing.reset();
  std::vector<node_id> culprits, waiting;
  for (node_id id : st.current.nodes) {
    if (st.nodes.at(id).state == node_state::lost || ph.ready.count(id)) continue;
    const auto it = round.reports.find(id);
    if (it == round.reports.end() || it->second.forming_blocked || it->second.epoch < st.epoch)
      culprits.push_back(id);
    else
      waiting.push_back(id);
  }
  std::string what = "epoch " + std::to_string(st.epoch) + " did not form within " + ms_text(round.deadline_ms);
  if (!culprits.empty())
    what += ": " + id_text(culprits) + " could not start forming it (a step of theirs does not end) or did not answer";
  else
    what += ": " + id_text(waiting) + " still forming";
  stalled(self, culprits, what);
}

/// A stall report of the probe in progress: kept; the culprit is named once every node answered.
template <class Phase>
bool take_report(coordinator_pointer self, Phase& ph, stall_report& r) {
  if (!ph.probing || r.probe != ph.probing->id) return false;
  ph.probing->reports[r.node] = r;
  if (probe_complete(self->state, *ph.probing)) decide(self, ph);
  return true;
}

/// The probe's time is up (nodes that did not answer are suspects): the culprit is named now.
template <class Phase>
bool probe_time_up(coordinator_pointer self, Phase& ph, const coordinator_deadline& d) {
  if (d.kind != deadline_kind::probe || !ph.probing || ph.probing->id != d.probe) return false;
  decide(self, ph);
  return true;
}

}  // namespace

double step_deadline_ms(const coordinator_state& st) {
  const auto& p = st.deps.faults;
  if (st.recent_step_ms.empty()) return std::max(p.first_step_deadline_ms, p.step_deadline_min_ms);
  auto sorted = st.recent_step_ms;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  const double median = sorted[sorted.size() / 2];
  double d = std::max(p.step_deadline_min_ms, p.step_deadline_factor * median);
  if (st.step == st.first_step_of_epoch) d += p.step_deadline_min_ms;  // the epoch's first step: warm-up
  return d;
}

double form_deadline_ms(const coordinator_state& st, std::int64_t copy_bytes) {
  const auto& p = st.deps.faults;
  return p.form_deadline_ms + static_cast<double>(copy_bytes) / std::max(1.0, p.form_bytes_per_ms);
}

void arm_step_deadline(coordinator_pointer self) {
  auto& st = self->state;
  set_deadline(self, step_deadline_ms(st), {deadline_kind::step, st.epoch, st.step, 0});
}

void arm_commit_deadline(coordinator_pointer self) {
  auto& st = self->state;
  set_deadline(self, step_deadline_ms(st), {deadline_kind::commit, st.epoch, st.step, 0});
}

void arm_form_deadline(coordinator_pointer self, std::int64_t copy_bytes) {
  auto& st = self->state;
  set_deadline(self, form_deadline_ms(st, copy_bytes), {deadline_kind::form, st.epoch, st.step, 0});
}

void note_committed(coordinator_pointer self, double wall_ms) {
  auto& st = self->state;
  st.recent_step_ms.push_back(wall_ms);
  if (st.recent_step_ms.size() > 20) st.recent_step_ms.erase(st.recent_step_ms.begin());
  st.errors.clear();
  st.stalls.clear();
  st.commit_epoch = st.epoch;
}

void evict(coordinator_pointer self, node_id node, const std::string& why) {
  auto& st = self->state;
  auto& n = st.nodes.at(node);
  if (n.state == node_state::lost) return;
  n.state = node_state::lost;
  n.lost_reason = "evicted: " + why;
  ++st.evicted;
  st.deps.log(to_string(node) + " evicted: " + n.name + " (" + why + "); it is told to exit");
  publish(self, {event_kind::node_lost, st.epoch, st.step, node.value, 0, n.lost_reason});
  self->send(n.monitor, evict_atom_v, why);
  self->demonitor(n.monitor.address());
  std::erase(st.joining, node);
  if (st.current.contains(node)) on_loss(self, node);
}

bool own_failure(coordinator_pointer self, const node_fault& f) {
  auto& st = self->state;
  if (!f.own || f.epoch < st.commit_epoch) return false;
  const auto it = st.nodes.find(f.node);
  if (it == st.nodes.end() || it->second.state == node_state::lost) return false;
  const int strikes = ++st.errors[f.node];
  st.deps.log(to_string(f.node) + "'s stage failed in epoch " + std::to_string(f.epoch) + " (" +
              std::to_string(strikes) + " of " + std::to_string(st.deps.faults.evict_after_errors) +
              " before eviction): " + f.what);
  // The strike's event, whatever comes of it (the retry that follows does not publish another).
  publish(self, {event_kind::step_failed, st.epoch, st.step, f.node.value, 0, f.what});
  if (strikes < st.deps.faults.evict_after_errors) return false;
  evict(self, f.node, "its stages failed " + std::to_string(strikes) + " time(s) since the last commit: " + f.what);
  return true;
}

bool failures_stop_the_job(const coordinator_state& st) { return st.failures_without_loss > stop_threshold(st); }

bool handle(coordinator_pointer self, phase::training& ph, coordinator_deadline& d) {
  auto& st = self->state;
  if (d.epoch != st.epoch || d.step != st.step) return false;
  if (d.kind == deadline_kind::step && !ph.probing) {
    const double deadline = step_deadline_ms(st);
    st.deps.log("step " + std::to_string(st.step) + " has not finished within " + ms_text(deadline) +
                ": asking the nodes what their stages are doing");
    ph.probing = start_probe(self, deadline);
    return true;
  }
  return probe_time_up(self, ph, d);
}

bool handle(coordinator_pointer self, phase::training& ph, stall_report& r) { return take_report(self, ph, r); }

bool handle(coordinator_pointer self, phase::forming& ph, coordinator_deadline& d) {
  auto& st = self->state;
  if (d.epoch != st.epoch) return false;
  if (d.kind == deadline_kind::form && !ph.probing) {
    st.deps.log("epoch " + std::to_string(st.epoch) + " has not formed in time: asking the nodes what they do");
    ph.probing = start_probe(self, ms_between(ph.assignments_sent, st.deps.now()));
    return true;
  }
  return probe_time_up(self, ph, d);
}

bool handle(coordinator_pointer self, phase::forming& ph, stall_report& r) { return take_report(self, ph, r); }

bool handle(coordinator_pointer self, phase::committing& ph, coordinator_deadline& d) {
  auto& st = self->state;
  if (d.kind != deadline_kind::commit || d.epoch != st.epoch || d.step != st.step) return false;
  if (ph.pending.empty()) return true;
  // The commit was decided (every pipeline reported): it stands. A node that has not confirmed it
  // in time may or may not have applied it: its layers cannot be trusted, so it goes, once a node
  // answers a ping: this coordinator is still heard. When none answers within the loss window, it
  // was cut off or frozen (a confirmation sent to it is stuck on the way): nobody is evicted, the
  // deadline comes back, and the heartbeat timeout, when it passes first, has every node lost at
  // once (the coordinator then waits for them with their state, §10 "Coordinator loss").
  const double deadline = step_deadline_ms(st);
  auto heard = std::make_shared<bool>(false);
  const auto evict_late = [self, epoch = d.epoch, step = d.step, deadline, heard](bool follows) {
    if (!follows || std::exchange(*heard, true)) return;  // a node that lost this coordinator too: not heard
    guarded(self, "a commit's late nodes", [&] {
      auto& st = self->state;
      auto* ph = std::get_if<phase::committing>(&st.phase);
      if (!ph || st.epoch != epoch || st.step != step) return;
      const std::vector<node_id> late(ph->pending.begin(), ph->pending.end());
      for (node_id id : late)
        evict(self, id,
              "it did not confirm the commit of step " + std::to_string(step) + " within " + ms_text(deadline));
    });
  };
  const auto window = std::chrono::milliseconds(static_cast<std::int64_t>(st.deps.loss_window_ms));
  for (node_id id : st.current.nodes)
    if (const auto& n = st.nodes.at(id); n.state != node_state::lost)
      self->request(n.monitor, window, ping_atom_v).then(evict_late, [](caf::error&) {});
  set_deadline(self, st.deps.loss_window_ms, {deadline_kind::commit, st.epoch, st.step, d.probe + 1});
  return true;
}

}  // namespace oobleck::actors
