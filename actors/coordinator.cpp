#include "actors/coordinator.hpp"

#include "actors/coordinator_checkpoint.hpp"
#include "actors/coordinator_training.hpp"

#include <algorithm>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/result.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

namespace oobleck::actors {

using namespace oobleck::messages;

bool epoch_layout::contains(node_id node) const {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

namespace {

template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

/// The one place a node-side message meets the phase: the phase that handles it decides (false:
/// of another epoch or step); every other phase drops it. Both count in `dropped`.
template <class Message>
void dispatch(coordinator_pointer self, Message& m) {
  auto& st = self->state;
  const bool accepted = std::visit(
      [&](auto& ph) -> bool {
        if constexpr (requires { handle(self, ph, m); })
          return handle(self, ph, m);  // may enter another phase: `ph` is not used after
        else
          return false;
      },
      st.phase);
  if (!accepted) ++st.dropped;
}

std::int32_t alive_nodes(const coordinator_state& st) {
  std::int32_t alive = 0;
  for (const auto& [id, n] : st.nodes)
    if (n.state != node_state::lost) ++alive;
  return alive;
}

/// Before training: the job is ready once every expected node is admitted (and plans its first
/// epoch at once when it has steps to run); a loss before that makes it wait again.
void update_admission(coordinator_pointer self) {
  auto& st = self->state;
  const std::int32_t alive = alive_nodes(st);
  const bool enough = alive >= st.deps.expected_nodes;
  if (std::holds_alternative<phase::registering>(st.phase) && enough) {
    st.deps.log("ready: " + std::to_string(alive) + " node(s) admitted");
    if (st.deps.steps > 0) return plan_first_epoch(self);
    enter(self, phase::ready{});
  } else if (std::holds_alternative<phase::ready>(st.phase) && !enough) {
    enter(self, phase::registering{});
    st.deps.log("waiting for nodes: " + std::to_string(alive) + " of " + std::to_string(st.deps.expected_nodes) +
                " admitted");
  }
}

bool before_training(const job_phase& p) {
  return std::holds_alternative<phase::registering>(p) || std::holds_alternative<phase::ready>(p);
}

caf::result<admission> on_register(coordinator_pointer self, register_node& r) {
  auto& st = self->state;
  if (auto err = check_registration(r, st.deps.policy, st.nonces, st.deps.now())) {
    ++st.refused;
    st.deps.log("refused worker '" + r.name + "': " + describe(err));
    publish(self, {event_kind::node_refused, st.epoch, st.step, -1, 0, r.name + ": " + describe(err)});
    return err;
  }
  auto monitor = caf::actor_cast<monitor_actor>(self->current_sender());
  if (!monitor) return make_error(protocol_error::bad_request, "registration without a sender");
  const node_id id = st.next_node;
  st.next_node = node_id{id.value + 1};
  self->monitor(monitor);
  const bool training = !before_training(st.phase);
  st.nodes[id] = node_entry{r.name, r.slots, r.data, monitor, training ? node_state::joining : node_state::registered, {}};
  if (training) st.joining.push_back(id);
  st.deps.log(to_string(id) + " joined: " + r.name + " (" + std::to_string(r.slots) +
              " slot(s), data plane " + r.data.host + ":" + std::to_string(r.data.port) + ")" +
              (training ? "; it enters at the next step boundary" : ""));
  publish(self, {event_kind::node_joined, st.epoch, st.step, id.value, 0, r.name});
  // The admission must reach the node before its first epoch assignment, which this very
  // registration may trigger: deliver it now, then update the job.
  auto promise = self->make_response_promise<admission>();
  promise.deliver(admission{id, st.deps.job_toml, st.deps.policy.job_hash});
  if (auto pending = st.pending_faults.extract(id)) {
    for (const auto& f : pending.mapped()) {
      self->send(monitor, f);
      st.deps.log("sent " + to_string(f.kind) + " at step " + std::to_string(f.at_step) + " to " + to_string(id) +
                  " (" + r.name + ") on its admission");
    }
  }
  update_admission(self);
  return promise;
}

void on_down(coordinator_pointer self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& [id, n] : st.nodes) {
    if (n.state == node_state::lost || n.monitor.address() != dm.source) continue;
    n.state = node_state::lost;
    n.lost_reason = self->system().render(dm.reason);
    st.deps.log(to_string(id) + " lost: " + n.name + " (" + n.lost_reason + ")");
    publish(self, {event_kind::node_lost, st.epoch, st.step, id.value, 0, n.lost_reason});
    std::erase(st.joining, id);
    const node_id node = id;
    std::visit(overloaded{
                   [&](phase::registering&) { update_admission(self); },
                   [&](phase::ready&) { update_admission(self); },
                   [&](phase::stopped&) {},
                   [&](auto&) {
                     if (st.current.contains(node)) on_loss(self, node);
                   },
               },
               st.phase);
    return;
  }
  auto& subs = st.subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const caf::actor& a) { return a.address() == dm.source; }),
             subs.end());
}

caf::error check_operator(coordinator_pointer self, const control_proof& p) {
  auto& st = self->state;
  auto err = check_control(p, st.deps.policy, st.nonces, st.deps.now());
  if (err) st.deps.log("refused an operator request: " + describe(err));
  return err;
}

caf::result<std::string> on_inject(coordinator_pointer self, const inject_fault& f) {
  auto& st = self->state;
  const node_id target{f.node};  // operators name nodes by their number
  auto it = st.nodes.find(target);
  if (it == st.nodes.end() && target >= st.next_node && f.at_step >= 0) {
    st.pending_faults[target].push_back(f);
    const std::string what = to_string(f.kind) + " at step " + std::to_string(f.at_step) + " for node " +
                             std::to_string(f.node) + ": delivered when it joins";
    st.deps.log(what);
    return what;
  }
  if (it == st.nodes.end() || it->second.state == node_state::lost)
    return make_error(protocol_error::unknown_node, "node " + std::to_string(f.node) + " is not a live node of this job");
  self->send(it->second.monitor, f);
  const std::string what =
      "sent " + to_string(f.kind) + " to node " + std::to_string(f.node) + " (" + it->second.name + ")";
  st.deps.log(what);
  return what;
}

}  // namespace

job_status make_status(const coordinator_state& st) {
  job_status s;
  s.state = std::string(phase_name(st.phase));
  if (const auto* stop = std::get_if<phase::stopped>(&st.phase);
      stop && stop->outcome != stop_outcome::finished && stop->outcome != stop_outcome::shutdown)
    s.state = "failed";
  s.epoch = st.epoch;
  s.committed_steps = st.committed;
  s.last_loss = st.last_loss;
  s.samples_per_second = st.samples_per_second;
  s.dropped_messages = st.dropped;
  for (const auto& [id, n] : st.nodes) {
    std::int32_t rank = -1;
    for (std::size_t p = 0, r = 0; p < st.current.pipelines.size(); ++p)
      for (auto node : st.current.pipelines[p].nodes) {
        if (node == id && n.state != node_state::lost) rank = static_cast<std::int32_t>(r);
        ++r;
      }
    std::string state = n.state == node_state::lost      ? "lost"
                        : n.state == node_state::joining ? "joining"
                                                         : "registered";
    if (n.state == node_state::registered && st.epoch > 0) state = rank >= 0 ? "training" : "idle";
    s.nodes.push_back({id.value, n.name, state, rank});
  }
  for (const auto& p : st.current.pipelines) {
    pipeline_status ps{{}, {}, p.microbatches};
    for (node_id n : p.nodes) ps.nodes.push_back(n.value);
    s.pipelines.push_back(std::move(ps));
  }
  return s;
}

coordinator_actor::behavior_type coordinator(coordinator_pointer self, coordinator_deps deps) {
  self->state.deps = std::move(deps);
  self->state.step = self->state.deps.checkpoint.resume_step;  // 0, or a resumed job's next step
  self->state.last_checkpoint = self->state.deps.checkpoint.resume_dir;
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [self](nonce_request& r) -> caf::result<std::string> {
        auto& st = self->state;
        if (r.protocol_version != st.deps.policy.protocol_version)
          return make_error(protocol_error::wrong_version,
                            "the worker speaks protocol " + std::to_string(r.protocol_version) +
                                ", the coordinator " + std::to_string(st.deps.policy.protocol_version));
        return st.nonces.issue(st.deps.now());
      },
      [self](register_node& r) -> caf::result<admission> { return on_register(self, r); },
      [self](node_ready& r) { dispatch(self, r); },
      [self](node_fault& f) { dispatch(self, f); },
      [](epoch_aborted&) {},  // survivors confirm the abort; the new epoch does not wait for it
      [self](pipeline_done& d) { dispatch(self, d); },
      [self](step_committed& c) { dispatch(self, c); },
      [self](checkpoint_written& w) { dispatch(self, w); },
      [self](status_atom, control_proof& p) -> caf::result<job_status> {
        if (auto err = check_operator(self, p)) return err;
        return make_status(self->state);
      },
      [self](inject_fault& f, control_proof& p) -> caf::result<std::string> {
        if (auto err = check_operator(self, p)) return err;
        return on_inject(self, f);
      },
      [self](subscribe_atom, caf::actor& who, control_proof& p) -> caf::result<std::string> {
        if (auto err = check_operator(self, p)) return err;
        self->monitor(who);
        self->state.subscribers.push_back(who);
        return std::string("subscribed");
      },
      [self](shutdown_atom, std::string& reason, control_proof& p) -> caf::result<std::string> {
        if (auto err = check_operator(self, p)) return err;
        stop_job(self, stop_outcome::shutdown, reason);
        return std::string("shutting down");
      },
  };
}

}  // namespace oobleck::actors
