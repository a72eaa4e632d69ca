#include "actors/injector.hpp"

#include "actors/admission.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

using injector_pointer = caf::stateful_actor<injector_state>*;

/// Sends `request` to the coordinator with a fresh proof; `then` gets the reply.
template <class Reply, class... Ts>
void ask(injector_pointer self, std::function<void(Reply&)> then, Ts... xs) {
  auto c = self->state.deps.coordinator;
  self->request(c, caf::infinite, nonce_request{protocol_version})
      .then(
          [self, c, then, xs...](std::string& nonce) {
            const control_proof proof{nonce, control_proof_of(self->state.deps.token, nonce)};
            self->request(c, caf::infinite, xs..., proof)
                .then([then](Reply& r) { then(r); },
                      [self](caf::error& e) { self->state.deps.log("the coordinator refused: " + describe(e)); });
          },
          [self](caf::error& e) { self->state.deps.log("no nonce from the coordinator: " + describe(e)); });
}

/// Hands every fault to the coordinator, which keeps those of nodes that have not joined yet and
/// delivers them on admission.
void hand_over_faults(injector_pointer self) {
  for (const auto& f : self->state.deps.faults)
    ask<std::string>(
        self,
        [self](std::string& what) {
          self->state.deps.log(what);
          ++*self->state.deps.handed_over;
        },
        f);
}

void count_unfired(injector_pointer self) {
  auto& st = self->state;
  int unfired = 0;
  for (const auto& f : st.deps.faults)
    if (!st.lost_nodes.count(f.node) &&
        !((f.kind == fault_kind::error || f.kind == fault_kind::stall) && st.failed_nodes.count(f.node))) {
      ++unfired;
      st.deps.log("the " + to_string(f.kind) + " of node " + std::to_string(f.node) + " at step " +
                  std::to_string(f.at_step) + " did not fire (the step passed before it was armed, or the "
                  "node ran no stage in it)");
    }
  *st.deps.unfired = unfired;
}

}  // namespace

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps) {
  self->state.deps = std::move(deps);
  self->monitor(self->state.deps.coordinator);
  self->set_down_handler([self](caf::down_msg&) {
    count_unfired(self);  // the coordinator is gone: every loss it published has arrived
    self->quit();
  });
  *self->state.deps.unfired = static_cast<int>(self->state.deps.faults.size());
  ask<std::string>(
      self, [self](std::string&) { hand_over_faults(self); }, subscribe_atom_v, caf::actor_cast<caf::actor>(self));
  return {
      [self](job_event& e) {
        if (e.kind == event_kind::node_lost) self->state.lost_nodes.insert(e.node);
        if (e.kind == event_kind::step_failed && e.node >= 0) self->state.failed_nodes.insert(e.node);
        if (e.kind == event_kind::stopped) {
          count_unfired(self);
          self->quit();
        }
      },
  };
}

}  // namespace oobleck::actors
