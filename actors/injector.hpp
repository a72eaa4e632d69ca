#pragma once
// The failure injector: a small actor of the kind users write to extend Oobleck. It subscribes to
// the coordinator's events (proving the job token) and hands every scheduled fault to the
// coordinator, which delivers it to its node's monitor (at once for a live node; on admission,
// before the node's first epoch assignment, for one that has not joined yet). The monitor arms
// it for the middle of that step (kill: SIGKILL of the node's own process; hang: SIGSTOP).
// `handed_over` counts the faults the coordinator took: a caller that waits for all of them
// before starting the workers knows every fault is armed before its step.
//
//   subscribing --(subscribed)--> handing over --(node_lost events)--> stopped: count unfired

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
  /// Faults the coordinator has taken (for a live node, or kept for one yet to join).
  std::shared_ptr<std::atomic<int>> handed_over = std::make_shared<std::atomic<int>>(0);
};

struct injector_state {
  injector_deps deps;
  std::set<std::int64_t> lost_nodes;
  std::set<std::int64_t> failed_nodes;  ///< named by a step_failed event (error and stall faults fire so)
  static inline const char* name = "oobleck.injector";
};

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps);

}  // namespace oobleck::actors
