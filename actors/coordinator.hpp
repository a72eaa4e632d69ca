#pragma once
// The coordinator actor (DESIGN §5): the job's node registry and the operators' entry point. It
// admits workers (admission.hpp), monitors each admitted node's monitor actor, so that a node's
// loss (its process crashed, or the connection timed out) arrives here as a down message, and
// publishes what happens to subscriber actors (the extension point for users' own actors).
//
//   registering --(every expected node admitted)--> ready
//        ^                                            |
//        +------------(a node is lost)----------------+
//
// The training states (forming an epoch, training, reconfiguring) join with the training path.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/stateful_actor.hpp>

#include "actors/admission.hpp"
#include "messages/actor_interfaces.hpp"

namespace oobleck::actors {

/// What the coordinator is built with (the composition root fills it).
struct coordinator_deps {
  admission_policy policy;
  std::string job_toml;          ///< sent to every admitted worker
  std::int32_t expected_nodes = 1;  ///< nodes to wait for before the job is ready
  /// Progress lines for humans (stdout in oobleck-coordinator).
  std::function<void(const std::string&)> log = [](const std::string&) {};
  std::function<nonce_book::clock::time_point()> now = [] { return nonce_book::clock::now(); };
};

/// One admitted node.
struct node_entry {
  std::string name;
  std::int32_t slots = 1;
  messages::endpoint data;
  messages::monitor_actor monitor;
  std::string state = "registered";  ///< "registered" or "lost"
  std::string lost_reason;
};

struct coordinator_state {
  coordinator_deps deps;
  nonce_book nonces;
  std::map<std::int64_t, node_entry> nodes;
  std::int64_t next_node = 0;
  std::string job_state = "registering";
  std::vector<caf::actor> subscribers;
  std::uint64_t refused = 0;  ///< registrations refused so far

  static inline const char* name = "oobleck.coordinator";
};

using coordinator_pointer = messages::coordinator_actor::stateful_pointer<coordinator_state>;

messages::coordinator_actor::behavior_type coordinator(coordinator_pointer self, coordinator_deps deps);

/// The status snapshot the coordinator replies with (also used by tests).
messages::job_status make_status(const coordinator_state& st);

}  // namespace oobleck::actors
