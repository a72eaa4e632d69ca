#pragma once
// The failure injector: a small actor of the kind users write to extend Oobleck. It subscribes to
// the coordinator's events (proving the job token) and, when the job's first epoch has formed,
// asks the coordinator to deliver each scheduled fault to its node's monitor, which arms it for
// the middle of that step (kill: SIGKILL of the node's own process; hang: SIGSTOP).
//
// Each node's faults are sent as soon as the node has joined (node_joined, or already listed by
// the coordinator's status), so they are armed before the node's first step.
//
//   subscribing --(subscribed)--> arming (per node_joined) --stopped--> done

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::actors {

struct injector_deps {
  messages::coordinator_actor coordinator;
  std::string token;
  std::vector<messages::inject_fault> faults;  ///< each with its node and at_step
  std::function<void(const std::string&)> log = [](const std::string&) {};
  /// Faults not seen to fire (their node never lost) when the job stopped; the composition root
  /// reads it after the job so that a fault that could not fire is not silently a success.
  std::shared_ptr<std::atomic<int>> unfired = std::make_shared<std::atomic<int>>(0);
};

struct injector_state {
  injector_deps deps;
  std::set<std::int64_t> armed_nodes;  ///< nodes whose faults were sent
  std::set<std::int64_t> lost_nodes;
  static inline const char* name = "oobleck.injector";
};

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps);

}  // namespace oobleck::actors
