#pragma once
// The failure injector: a small actor of the kind users write to extend Oobleck. It subscribes to
// the coordinator's events (proving the job token) and, when the job's first epoch has formed,
// asks the coordinator to deliver each scheduled fault to its node's monitor, which arms it for
// the middle of that step (kill: SIGKILL of the node's own process; hang: SIGSTOP).
//
//   subscribing --(subscribed)--> waiting --epoch_formed--> armed --stopped--> done

#include <functional>
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
};

struct injector_state {
  injector_deps deps;
  bool armed = false;
  static inline const char* name = "oobleck.injector";
};

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps);

}  // namespace oobleck::actors
