#include "actors/injector.hpp"

#include "actors/admission.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

using injector_pointer = caf::stateful_actor<injector_state>*;

/// Sends `xs...` to the coordinator with a fresh proof, each request waiting at most `wait`;
/// `then` gets the reply, `failed` the error (no nonce, a refusal, or no answer).
template <class Reply, class... Ts>
void ask(injector_pointer self, std::chrono::milliseconds wait, std::function<void(Reply&)> then,
         std::function<void(const caf::error&)> failed, Ts... xs) {
  auto c = self->state.deps.coordinator;
  self->request(c, wait, nonce_request{protocol_version})
      .then(
          [self, c, wait, then, failed, xs...](std::string& nonce) {
            const control_proof proof{nonce, control_proof_of(self->state.deps.token, nonce)};
            self->request(c, wait, xs..., proof).then([then](Reply& r) { then(r); }, [failed](caf::error& e) { failed(e); });
          },
          [failed](caf::error& e) { failed(e); });
}

/// Hands the faults not yet delivered (and whose node was not lost) to the coordinator, which
/// keeps those of nodes that have not joined yet and delivers them on admission.
void hand_over_faults(injector_pointer self) {
  auto& st = self->state;
  for (std::size_t i = 0; i < st.deps.faults.size(); ++i) {
    const auto& f = st.deps.faults[i];
    if (st.delivered[i] || st.lost_workers.count(st.fault_worker[i])) continue;
    const int incarnation = st.incarnation;
    ask<std::string>(
        self, std::chrono::seconds(30),
        [self, i, incarnation](std::string& what) {
          auto& s = self->state;
          s.deps.log(what);
          if (s.taken_by[i] == 0) ++*s.deps.handed_over;
          s.taken_by[i] = incarnation;
          // Sent at once to a node this coordinator admitted already (its node_joined came first).
          if (incarnation == s.incarnation && s.joined_here.count(s.deps.faults[i].node)) s.delivered[i] = true;
        },
        [self](const caf::error& e) { self->state.deps.log("the coordinator refused a fault: " + describe(e)); }, f);
  }
}

void count_unfired(injector_pointer self) {
  auto& st = self->state;
  if (st.stopped) return;
  st.stopped = true;
  int unfired = 0;
  for (std::size_t i = 0; i < st.deps.faults.size(); ++i) {
    const auto& f = st.deps.faults[i];
    const auto& worker = st.fault_worker[i];
    const bool in_stage = f.kind == fault_kind::error || f.kind == fault_kind::stall;
    if (worker.empty() || (!st.lost_workers.count(worker) && !(in_stage && st.failed_workers.count(worker)))) {
      ++unfired;
      st.deps.log("the " + to_string(f.kind) + " of node " + std::to_string(f.node) + " at step " +
                  std::to_string(f.at_step) + " did not fire (the step passed before it was armed, or the "
                  "node ran no stage in it)");
    }
  }
  *st.deps.unfired = unfired;
}

/// Node `node` is worker `name` at this coordinator, which sent it the faults it held for it.
void note_joined(injector_pointer self, std::int64_t node, const std::string& name) {
  auto& st = self->state;
  st.name_of[node] = name;
  st.lost_workers.erase(name);  // back (or new)
  st.joined_here.insert(node);
  for (std::size_t i = 0; i < st.deps.faults.size(); ++i) {
    if (st.deps.faults[i].node != node) continue;
    if (st.fault_worker[i].empty()) st.fault_worker[i] = name;
    if (st.taken_by[i] == st.incarnation) st.delivered[i] = true;
  }
}

/// Subscribed again after a loss: the events published before (a replacement adopts the job and
/// trains on within milliseconds) are read from the coordinator's status: the nodes it lost, and
/// those it admitted (it sent them their faults). Then the faults it should hold are handed over.
void catch_up(injector_pointer self) {
  ask<job_status>(
      self, std::chrono::seconds(5),
      [self](job_status& s) {
        auto& st = self->state;
        std::set<std::string> live;
        for (const auto& n : s.nodes) {
          note_joined(self, n.node, n.name);
          if (n.state != "lost") live.insert(n.name);
        }
        for (const auto& n : s.nodes)  // a worker is lost when no entry of it is live
          if (!live.count(n.name)) st.lost_workers.insert(n.name);
        hand_over_faults(self);
      },
      [self](const caf::error& e) {
        self->state.deps.log("no status from the coordinator (" + describe(e) + "): handing the faults over as they are");
        hand_over_faults(self);
      },
      status_atom_v);
}

/// How long to wait before the next attempt after a subscription failed with `e`: where no answer
/// came at all and the injector can drop its connection (deps.drop_coordinator_link), it closes
/// it so that the next attempt connects afresh, and waits relink_wait when one was closed.
std::chrono::milliseconds relink_if_unanswered(injector_pointer self, const caf::error& e) {
  auto& d = self->state.deps;
  // None closed: the request went over a connection that had already ended (or no answer was
  // missing at all): the usual pace.
  const auto dropped = drop_unanswered_link(e, d.drop_coordinator_link, d.log, "the injector's");
  return dropped && *dropped > 0 ? d.relink_wait : std::chrono::milliseconds{100};
}

/// Subscribes to the coordinator in deps (the first, or one found after a loss), then hands over
/// the faults it should hold. A coordinator found after a loss that does not answer in time (the
/// lost one's connection, still cached by the middleman) sends the injector looking again.
void subscribe(injector_pointer self, bool found_again) {
  // (Right after a loss the middleman may still hand out the lost coordinator's connection, which
  // answers nothing: a short wait, and the next attempt usually reaches the coordinator.)
  const auto wait = found_again ? std::chrono::milliseconds(500) : std::chrono::milliseconds(30000);
  ask<std::string>(
      self, wait,
      [self, found_again](std::string&) {
        if (!found_again) return hand_over_faults(self);
        self->state.looking_until.reset();
        self->state.deps.log("subscribed to the coordinator at its address again");
        catch_up(self);
      },
      [self, found_again](const caf::error& e) {
        auto& st = self->state;
        if (!found_again) return st.deps.log("the coordinator refused the subscription: " + describe(e));
        if (st.failed_attempts++ % 20 == 0)
          st.deps.log("the coordinator found did not take the subscription (" + describe(e) + "): looking again");
        self->delayed_send(self, relink_if_unanswered(self, e), reconnect_atom_v);
      },
      subscribe_atom_v, caf::actor_cast<caf::actor>(self));
}

/// The coordinator went away before the job stopped: look for one (until the grace ends).
void start_looking(injector_pointer self) {
  auto& st = self->state;
  if (st.stopped) return;
  if (!st.deps.find_coordinator) {
    count_unfired(self);  // every loss the coordinator published has arrived
    return self->quit();
  }
  if (st.looking_until) return;  // already looking (an attempt is in flight)
  st.looking_until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(st.deps.grace_s));
  st.deps.log("lost the coordinator: looking for it (or a replacement) for " + std::to_string(st.deps.grace_s) + " s");
  self->send(self, reconnect_atom_v);
}

/// One attempt to find a coordinator while looking.
void look(injector_pointer self) {
  auto& st = self->state;
  if (st.stopped || !st.looking_until) return;
  if (std::chrono::steady_clock::now() >= *st.looking_until) {
    st.deps.log("no coordinator came back within " + std::to_string(st.deps.grace_s) + " s");
    count_unfired(self);
    return self->quit();
  }
  auto found = st.deps.find_coordinator();
  if (!found) return self->delayed_send(self, std::chrono::milliseconds(100), reconnect_atom_v);
  // Another process is a replacement, which holds none of the faults; the same process (woken from
  // a freeze, reached again) still holds those of nodes yet to join.
  const bool replacement = caf::actor_cast<caf::actor_addr>(*found).node() !=
                           caf::actor_cast<caf::actor_addr>(st.deps.coordinator).node();
  if (replacement) {
    ++st.incarnation;
    st.joined_here.clear();
  }
  st.deps.coordinator = *found;
  self->monitor(st.deps.coordinator);
  subscribe(self, true);
}

}  // namespace

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps) {
  auto& st = self->state;
  st.deps = std::move(deps);
  st.delivered.assign(st.deps.faults.size(), false);
  st.taken_by.assign(st.deps.faults.size(), 0);
  st.fault_worker.assign(st.deps.faults.size(), "");
  self->monitor(st.deps.coordinator);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source == self->state.deps.coordinator.address()) start_looking(self);
  });
  // The composition root ends the injector when the job is over (whether or not it saw the stop).
  self->set_exit_handler([self](caf::exit_msg& m) {
    count_unfired(self);
    self->quit(m.reason);
  });
  *st.deps.unfired = static_cast<int>(st.deps.faults.size());
  subscribe(self, false);
  return {
      [self](job_event& e) {
        auto& s = self->state;
        const auto worker = s.name_of.find(e.node);
        if (e.kind == event_kind::node_lost && worker != s.name_of.end()) s.lost_workers.insert(worker->second);
        if (e.kind == event_kind::step_failed && worker != s.name_of.end()) s.failed_workers.insert(worker->second);
        // The coordinator sent the faults it held for the node with its admission.
        if (e.kind == event_kind::node_joined) note_joined(self, e.node, e.detail);
        // A coordinator that a newer one replaced stops; the job goes on with the newer one.
        if (e.kind == event_kind::stopped && e.outcome != stop_outcome::superseded) {
          count_unfired(self);
          self->quit();
        }
      },
      [self](reconnect_atom) { look(self); },
  };
}

}  // namespace oobleck::actors
