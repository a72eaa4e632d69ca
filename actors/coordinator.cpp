#include "actors/coordinator.hpp"

#include "actors/coordinator_checkpoint.hpp"
#include "actors/coordinator_gate.hpp"
#include "actors/coordinator_training.hpp"

#include <algorithm>
#include <set>
#include <type_traits>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/result.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

namespace oobleck::actors {

using namespace oobleck::messages;

bool epoch_layout::contains(node_id node) const {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

namespace {

/// The one place a node-side message meets the phase: the gate first, then the phase that handles
/// it decides (false: of another epoch or step); every other phase drops it. Every message not
/// taken counts in `dropped`; no exception leaves.
template <class Message>
void dispatch(coordinator_pointer self, Message& m) {
  auto& st = self->state;
  const gate_verdict v = gate(self, m);
  if (v.kind == gate_verdict::fence) return void(++st.dropped);
  if (v.kind == gate_verdict::refuse) return refuse_message(self, message_name(m), v.why);
  const bool accepted = guarded(self, message_name(m), [&] { return handle_in_phase(self, m); });
  if (!accepted) ++st.dropped;
  forget_old_losses(st);
}

/// Before training: the job is ready once every expected node is admitted (and plans its first
/// epoch at once when it has steps to run); a loss before that makes it wait again.
void update_admission(coordinator_pointer self) {
  auto& st = self->state;
  const std::int32_t alive = live_count_of(st);
  const bool enough = alive >= st.deps.expected_nodes;
  if (std::holds_alternative<phase::registering>(st.phase) && enough) {
    st.deps.log("ready: " + std::to_string(alive) + " node(s) admitted");
    if (st.deps.steps > 0) return st.deps.profile_at_start ? start_profiling(self) : plan_first_epoch(self);
    enter(self, phase::ready{});
  } else if (std::holds_alternative<phase::ready>(st.phase) && !enough) {
    enter(self, phase::registering{});
    st.deps.log("waiting for nodes: " + std::to_string(alive) + " of " + std::to_string(st.deps.expected_nodes) +
                " admitted");
  }
}

bool before_training(const job_phase& p) {
  return std::holds_alternative<phase::registering>(p) || std::holds_alternative<phase::ready>(p) ||
         std::holds_alternative<phase::profiling>(p);
}

/// A request without a sender cannot be answered: CAF 0.17 lost the route of the connection it came
/// over (apps/coordinator_link.hpp), and the worker gives up on it and connects afresh. Refused,
/// counted and said, before anything is computed for it (no nonce issued, none consumed); true
/// when so.
bool refused_without_sender(coordinator_pointer self, const char* what) {
  if (self->current_sender()) return false;
  refuse_message(self, what,
                 "it came without a sender, so no answer can reach it (CAF lost the route of the connection it came "
                 "over; the worker connects afresh)");
  return true;
}

/// A worker refused: counted, said and published; returns `err` for the reply.
caf::error refuse_worker(coordinator_pointer self, const register_node& r, caf::error err) {
  auto& st = self->state;
  ++st.refused;
  st.deps.log("refused worker '" + r.name + "': " + describe(err));
  publish(self, {event_kind::node_refused, st.epoch, st.step, -1, 0, r.name + ": " + describe(err)});
  return err;
}

caf::result<admission> on_register(coordinator_pointer self, register_node& r) {
  auto& st = self->state;
  if (refused_without_sender(self, "register_node"))
    return make_error(protocol_error::bad_request, "a registration without a sender");
  if (auto err = check_registration(r, st.deps.policy, st.nonces, st.deps.now()))
    return refuse_worker(self, r, std::move(err));
  auto monitor = caf::actor_cast<monitor_actor>(self->current_sender());
  if (r.memory.present) {
    // A worker whose coordinator went away. Before training (a replacement) or while adopting, its
    // state is the job's; from a newer coordinator than this one, this one was replaced. Else
    // (this coordinator went on without it) it joins as a new node.
    if (std::holds_alternative<phase::registering>(st.phase) || std::holds_alternative<phase::adopting>(st.phase))
      return adopt_node(self, r, monitor);
    if (r.memory.term > st.term) {
      superseded(self, r.memory.term, "worker '" + r.name + "'");
      return make_error(protocol_error::superseded, "this coordinator was replaced by a newer one");
    }
    if (const auto it = st.nodes.find(node_id{r.memory.node}); r.memory.term == st.term && it != st.nodes.end()) {
      if (it->second.state != node_state::lost)
        // It lost this coordinator before this coordinator noticed it lost the node: its loss is on
        // the way (then this coordinator adopts it back, or goes on without it); it tries again.
        return make_error(protocol_error::not_registering,
                          "the coordinator has not yet seen this node's connection end; try again");
      if (std::find(st.unhandled_losses.begin(), st.unhandled_losses.end(), it->first) != st.unhandled_losses.end())
        // Its loss is seen but not handled: the coordinator still asks the other nodes whether it
        // is heard at all (check_reachable). Woken from a freeze, it may learn only now that every
        // node lost it, and then adopts them all back; refused here, this node would have ended
        // and taken its layers with it (seen in `coordinator clients e2e`: the job stopped with a
        // layer left without a holder). Its next attempt meets the decision.
        return make_error(protocol_error::not_registering,
                          "the coordinator is still handling this node's loss (is it itself cut off?); try again");
    }
    ++st.refused;
    st.deps.log("refused worker '" + r.name + "': it came back to this coordinator, which went on without it");
    return make_error(protocol_error::unknown_node,
                      "the coordinator went on without this node (it was declared lost); start the worker again to "
                      "join as a new node");
  }
  if (st.deps.policy.one_gpu_per_worker)
    for (const auto& [other, n] : st.nodes)
      if (n.state != node_state::lost && n.data.host == r.data.host && n.device_index == r.device_index)
        return refuse_worker(self, r,
                             make_error(protocol_error::wrong_device,
                                        "GPU " + std::to_string(r.device_index) + " of " + r.data.host + " is " +
                                            to_string(other) + "'s ('" + n.name +
                                            "'), and cluster.data_plane \"nccl\" takes one GPU per worker: "
                                            "start it with --device cuda:N of another GPU"));
  const node_id id = st.next_node;
  st.next_node = node_id{id.value + 1};
  self->monitor(monitor);
  const bool training = !before_training(st.phase);
  st.nodes[id] = node_entry{r.name, r.slots, r.data, monitor, training ? node_state::joining : node_state::registered, {},
                            r.device_index};
  if (training) st.joining.push_back(id);
  st.deps.log(to_string(id) + " joined: " + r.name + " (" + std::to_string(r.slots) +
              " slot(s), data plane " + r.data.host + ":" + std::to_string(r.data.port) + ")" +
              (training ? "; it enters at the next step boundary" : ""));
  publish(self, {event_kind::node_joined, st.epoch, st.step, id.value, 0, r.name});
  // The admission must reach the node before its first epoch assignment, which this very
  // registration may trigger: deliver it now, then update the job.
  auto promise = self->make_response_promise<admission>();
  promise.deliver(admission{id, st.deps.job_toml, st.deps.policy.job_hash, st.term});
  if (auto pending = st.pending_faults.extract(id)) {
    for (const auto& f : pending.mapped()) {
      self->send(monitor, f);
      st.deps.log("sent " + to_string(f.kind) + " at step " + std::to_string(f.at_step) + " to " + to_string(id) +
                  " (" + r.name + ") on its admission");
    }
  }
  update_admission(self);
  if (auto* waiting = std::get_if<phase::waiting>(&st.phase)) waiting_changed(self, *waiting);
  return promise;
}

/// A node of the epoch in force was lost. Before the loss is handled, is anyone else still there?
/// The first other node to answer a ping (milliseconds on a healthy cluster) has the losses
/// handled as before; if instead every node is lost, this coordinator was frozen or cut off, and
/// it waits for them (handle_losses). A window bounds the wait when nobody answers.
void check_reachable(coordinator_pointer self, node_id node) {
  auto& st = self->state;
  st.unhandled_losses.push_back(node);
  const auto coordinator = caf::actor_cast<coordinator_actor>(self);
  if (live_count_of(st) == 0)
    return self->send(coordinator, coordinator_deadline{deadline_kind::losses, st.epoch, st.step, st.loss_checks});
  if (st.unhandled_losses.size() > 1) return;  // a round is under way
  const std::uint64_t round = ++st.loss_checks;
  st.lost_us.clear();
  for (const auto& [id, n] : st.nodes) {
    if (n.state == node_state::lost) continue;
    self->request(n.monitor, std::chrono::milliseconds(static_cast<std::int64_t>(st.deps.loss_window_ms)), ping_atom_v)
        .then(
            [self, round, node = id](bool follows) {
              auto& st = self->state;
              if (st.loss_checks != round || st.unhandled_losses.empty()) return;
              if (!follows) {
                // It lost this coordinator too and has reached it again since (its loss not seen
                // here yet): no sign that this coordinator is still heard.
                st.lost_us.insert(node);
                if (!every_live_node_lost_us(st)) return;
              }
              handle_losses(self);
            },
            [](caf::error&) {});
  }
  self->delayed_send(coordinator, std::chrono::milliseconds(static_cast<std::int64_t>(st.deps.loss_window_ms)),
                     coordinator_deadline{deadline_kind::losses, st.epoch, st.step, round});
}

void on_down(coordinator_pointer self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& [id, n] : st.nodes) {
    if (n.state == node_state::lost || n.monitor.address() != dm.source) continue;
    const node_id node = id;
    mark_lost(self, node, self->system().render(dm.reason));
    std::visit(overloaded{
                   [&](phase::registering&) { update_admission(self); },
                   [&](phase::ready&) { update_admission(self); },
                   [&](phase::profiling& ph) { profiling_lost(self, ph, node); },
                   [&](phase::stopped&) {},
                   [&](phase::adopting& ph) { adoption_lost(self, ph, node); },
                   [&](phase::waiting& ph) { waiting_lost(self, ph, node); },
                   [&](auto&) {
                     if (!st.current.contains(node)) return;
                     check_reachable(self, node);
                   },
               },
               st.phase);
    forget_old_losses(st);
    return;
  }
  auto& subs = st.subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const caf::actor& a) { return a.address() == dm.source; }),
             subs.end());
  forget_old_losses(st);
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

namespace {

/// The coordinator, with exit messages from other processes dropped before CAF's own handling
/// (which quits on exit_reason::kill without asking the actor).
class coordinator_impl : public caf::stateful_actor<coordinator_state, coordinator_actor::base> {
 public:
  using super = caf::stateful_actor<coordinator_state, coordinator_actor::base>;
  coordinator_impl(caf::actor_config& cfg, coordinator_deps deps) : super(cfg), deps_(std::move(deps)) {}

  behavior_type make_behavior() override { return coordinator(this, std::move(deps_)); }

  caf::invoke_message_result consume(caf::mailbox_element& x) override {
    if (x.content().match_elements<caf::exit_msg>() && (!x.sender || x.sender->node() != node())) {
      current_mailbox_element(&x);  // the refusal names the sender
      refuse_message(this, "an exit message", "only an actor of the coordinator's own process may stop it");
      current_mailbox_element(nullptr);
      return caf::invoke_message_result::dropped;
    }
    return super::consume(x);
  }

 private:
  coordinator_deps deps_;
};

}  // namespace

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_deps deps) {
  return sys.spawn<coordinator_impl>(std::move(deps));
}

void stop_coordinator(caf::actor_system& sys, const coordinator_actor& coordinator, caf::exit_reason reason) {
  caf::scoped_actor self{sys};
  self->send_exit(coordinator, reason);
}

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
  s.refused_messages = st.refused_messages;
  if (const auto* waiting = std::get_if<phase::waiting>(&st.phase)) s.nodes_needed = waiting->need;
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
    pipeline_status ps{{}, p.stage_layers, p.microbatches};
    for (node_id n : p.nodes) ps.nodes.push_back(n.value);
    s.pipelines.push_back(std::move(ps));
  }
  return s;
}

coordinator_actor::behavior_type coordinator(coordinator_pointer self, coordinator_deps deps) {
  self->state.deps = std::move(deps);
  self->state.step = self->state.deps.checkpoint.resume_step;  // 0, or a resumed job's next step
  self->state.last_checkpoint = self->state.deps.checkpoint.resume_dir;
  self->state.term = self->state.deps.term;
  // System messages are messages too, and anyone who reaches the port can send one: a down
  // message counts only from the actor it reports (CAF sends it as that actor); an exit only from
  // an actor of this process (stop_coordinator); an error or an unexpected message never ends the
  // coordinator (CAF 0.17's defaults would quit on the first, print every one of the second).
  self->set_down_handler([self](caf::down_msg& dm) {
    if (!sent_by(self->current_sender(), dm.source))
      return refuse_message(self, "a down message", "it reports " + caf::to_string(dm.source) + " but was not sent as that actor");
    guarded(self, "a down message", [&] { on_down(self, dm); });
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    const auto& sender = self->current_sender();
    if (!sender || sender->node() != self->node())
      return refuse_message(self, "an exit message", "only an actor of the coordinator's own process may stop it");
    if (em.reason != caf::exit_reason::normal) self->quit(std::move(em.reason));
  });
  self->set_error_handler([self](caf::error& err) {
    refuse_message(self, "an error message", "no request of the coordinator's is pending (" + self->system().render(err) + ")");
  });
  self->set_default_handler([self](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    refuse_message(self, "a message of a type the coordinator does not take", "dropped");
    return caf::sec::unexpected_message;
  });
  return {
      [self](nonce_request& r) -> caf::result<std::string> {
        if (refused_without_sender(self, "nonce_request"))
          return make_error(protocol_error::bad_request, "a request without a sender");
        return guarded(self, "nonce_request", [&]() -> caf::result<std::string> {
          auto& st = self->state;
          if (r.protocol_version != st.deps.policy.protocol_version)
            return make_error(protocol_error::wrong_version,
                              "the worker speaks protocol " + std::to_string(r.protocol_version) +
                                  ", the coordinator " + std::to_string(st.deps.policy.protocol_version));
          if (auto nonce = st.nonces.issue(st.deps.now(), nonce_owner(self))) return *nonce;
          return make_error(protocol_error::bad_request,
                            "the coordinator holds too many unused nonces of other askers; try again in a minute");
        });
      },
      [self](register_node& r) -> caf::result<admission> {
        return guarded(self, "register_node", [&] { return on_register(self, r); });
      },
      [self](node_ready& r) { dispatch(self, r); },
      [self](node_fault& f) { dispatch(self, f); },
      // Survivors confirm the abort; the new epoch does not wait for it (the gate still counts forgeries).
      [self](epoch_aborted& a) { dispatch(self, a); },
      [self](pipeline_done& d) { dispatch(self, d); },
      [self](step_committed& c) { dispatch(self, c); },
      [self](checkpoint_written& w) { dispatch(self, w); },
      [self](checkpoint_deadline& d) {
        if (auto v = from_self(self); v.kind != gate_verdict::accept) return refuse_message(self, "checkpoint_deadline", v.why);
        guarded(self, "checkpoint_deadline", [&] { on_checkpoint_deadline(self, d); });
      },
      [self](stall_report& r) { dispatch(self, r); },
      [self](coordinator_deadline& d) {
        if (d.kind != deadline_kind::losses) return dispatch(self, d);  // the gate takes the coordinator's own only
        if (auto v = from_self(self); v.kind != gate_verdict::accept) return refuse_message(self, "coordinator_deadline", v.why);
        if (d.probe != self->state.loss_checks || self->state.unhandled_losses.empty()) return;  // handled already
        guarded(self, "the losses", [&] { handle_losses(self); });
      },
      [self](status_atom, control_proof& p) -> caf::result<job_status> {
        return guarded(self, "a status request", [&]() -> caf::result<job_status> {
          if (auto err = check_operator(self, p)) return err;
          return make_status(self->state);
        });
      },
      [self](inject_fault& f, control_proof& p) -> caf::result<std::string> {
        return guarded(self, "inject_fault", [&]() -> caf::result<std::string> {
          if (auto err = check_operator(self, p)) return err;
          return on_inject(self, f);
        });
      },
      [self](subscribe_atom, caf::actor& who, control_proof& p) -> caf::result<std::string> {
        return guarded(self, "a subscription", [&]() -> caf::result<std::string> {
          if (auto err = check_operator(self, p)) return err;
          self->monitor(who);
          self->state.subscribers.push_back(who);
          return std::string("subscribed");
        });
      },
      [self](replaced_atom, std::uint64_t term, control_proof& p) -> caf::result<std::string> {
        return guarded(self, "a replacement notice", [&]() -> caf::result<std::string> {
          if (auto err = check_operator(self, p)) return err;
          if (term <= self->state.term) return std::string("this coordinator's term is not older");
          superseded(self, term, "a worker adopted by it");
          return std::string("stopping: replaced");
        });
      },
      [self](shutdown_atom, std::string& reason, bool checkpoint, control_proof& p) -> caf::result<std::string> {
        return guarded(self, "a shutdown request", [&]() -> caf::result<std::string> {
          if (auto err = check_operator(self, p)) return err;
          if (checkpoint) {
            stop_after_checkpoint(self, stop_outcome::shutdown, reason);
            return std::string("shutting down after a checkpoint (when one can be written)");
          }
          stop_job(self, stop_outcome::shutdown, reason);
          return std::string("shutting down");
        });
      },
  };
}

}  // namespace oobleck::actors
