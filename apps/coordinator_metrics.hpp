#pragma once
// oobleck-coordinator --metrics-out: one JSON line per committed step and per event of the job
// (reconfigured, coordinator_restored, waiting_for_nodes, resumed, checkpoint_and_stop, eval),
// appended as they happen. The records' fields are read by tools (oobleck-report, the benchmarks,
// the tests): spelled as the README's "Metrics" section lists them.

#include <memory>
#include <ostream>
#include <string>

#include "actors/coordinator.hpp"

namespace oobleck::apps {

/// One step's line.
std::string step_json(const actors::step_record& r);
/// The line of a stop by the reconfiguration policy (checkpoint and stop).
std::string checkpoint_stop_json(const actors::checkpoint_stop_record& r);
/// An evaluation round's line ([eval]).
std::string eval_json(const actors::eval_record& r);

/// Points deps' step, reconfiguration, restore, waiting and resume callbacks at `metrics` (which
/// must not be null), one line each.
void write_metrics_records(actors::coordinator_deps& deps, std::shared_ptr<std::ostream> metrics);

}  // namespace oobleck::apps
