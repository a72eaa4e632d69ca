#pragma once
// The monitor's two halves (actors/monitor.cpp): the node's side (its stage slots, the
// coordinator's orders) and, in actors/monitor_registration.cpp, its standing with a coordinator:
// the first registration, and looking for a coordinator when it is lost (ARCHITECTURE.md §10,
// "Coordinator loss"). Private to the monitor.

#include <string>

#include "actors/monitor.hpp"

namespace oobleck::actors::monitor_detail {

// The node's side (monitor.cpp).

/// Starts the node's stage slots, once the job is known (deps.make_stage).
void start_stage(monitor_pointer self);
/// Aborts and stops the node's stage slots, saying `why`.
void retire_stage(monitor_pointer self, const std::string& why);

// Its standing with a coordinator (monitor_registration.cpp).

/// Registers with deps.coordinator; `memory` carries what the node kept when it comes back.
void start_registration(monitor_pointer self, messages::node_memory memory = {});
/// Comes back to a coordinator it reached with what this node kept of the job: the stage's layers
/// and gradients, and this monitor's commits and roles.
void rejoin(monitor_pointer self);
/// Starts looking for a coordinator for the grace period (deps.find_coordinator), unless it
/// already does. False where the node cannot look (no find_coordinator).
bool start_looking(monitor_pointer self, std::chrono::milliseconds first_after = {});
/// One more look for a coordinator (a replacement, or the same one back) until the grace ends,
/// no sooner than `at_least` from now; then the node stops.
void look_for_coordinator(monitor_pointer self, std::chrono::milliseconds at_least = {});

}  // namespace oobleck::actors::monitor_detail
