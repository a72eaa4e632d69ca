#pragma once
// What the deterministic protocol tests ask of a coordinator and of its log, shared by
// step_protocol_test.cpp and reconfiguration_fixture.cpp (CAF's test scheduler, no LibTorch).

#include <string>
#include <vector>

#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::testing {

/// The coordinator's answer to an operator's status request, asked as oobleck-ctl does (a nonce,
/// then the proof of `token` over it), with the scheduler run after each request.
messages::job_status request_status(caf::scoped_actor& self, caf::scheduler::test_coordinator& sched,
                                    const messages::coordinator_actor& coord, const std::string& token);

/// Whether some line of `log` contains `text`.
bool log_contains(const std::vector<std::string>& log, const std::string& text);

}  // namespace oobleck::testing
