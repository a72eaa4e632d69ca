#include "support/coordinator_probe.hpp"

#include <doctest/doctest.h>

#include "actors/admission.hpp"
#include "messages/protocol.hpp"

namespace oobleck::testing {

messages::job_status request_status(caf::scoped_actor& self, caf::scheduler::test_coordinator& sched,
                                    const messages::coordinator_actor& coord, const std::string& token) {
  std::string nonce;
  auto n = self->request(coord, caf::infinite, messages::nonce_request{messages::protocol_version});
  sched.run();
  n.receive([&](std::string& x) { nonce = x; }, [](caf::error& e) { FAIL(messages::describe(e)); });
  messages::job_status s;
  auto r = self->request(coord, caf::infinite, messages::status_atom_v,
                         messages::control_proof{nonce, actors::control_proof_of(token, nonce)});
  sched.run();
  r.receive([&](messages::job_status& x) { s = x; }, [](caf::error& e) { FAIL(messages::describe(e)); });
  return s;
}

bool log_contains(const std::vector<std::string>& log, const std::string& text) {
  for (const auto& l : log)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace oobleck::testing
