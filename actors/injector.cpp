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

void arm_all(injector_pointer self) {
  auto& st = self->state;
  if (st.armed) return;
  st.armed = true;
  for (const auto& f : st.deps.faults)
    ask<std::string>(self, [self](std::string& what) { self->state.deps.log(what + " (armed)"); }, f);
}

}  // namespace

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps) {
  self->state.deps = std::move(deps);
  self->monitor(self->state.deps.coordinator);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  ask<std::string>(
      self,
      [self](std::string&) {
        // Subscribed after the first epoch formed? Then arm now.
        ask<job_status>(self, [self](job_status& s) { if (s.epoch > 0) arm_all(self); }, status_atom_v);
      },
      subscribe_atom_v, caf::actor_cast<caf::actor>(self));
  return {
      [self](job_event& e) {
        if (e.kind == event_kind::epoch_formed) arm_all(self);
        if (e.kind == event_kind::stopped) self->quit();
      },
  };
}

}  // namespace oobleck::actors
