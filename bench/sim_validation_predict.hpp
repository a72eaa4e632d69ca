#pragma once
// The simulator validation's predictions: the simulator (the Oobleck policy) replays a case's node
// subset with the measured costs and contention model, and its throughput is set against what
// oobleck-local measured, over the whole window and between consecutive events.

#include <cmath>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "bench/sim_validation_cases.hpp"
#include "planning/planner.hpp"
#include "sim/policy.hpp"
#include "sim/recovery_costs.hpp"
#include "sim/replay_schedule.hpp"
#include "sim/trace.hpp"

namespace oobleck::bench {

/// The validated job as the planner and the simulator see it.
struct validation_job {
  apps::job_file job;
  planning::profile profile;  ///< measured here by oobleck-profile
  sim::recovery_costs costs;

  /// f of a case: its own, else the job's.
  [[nodiscard]] int fault_tolerance(const replay_case& c) const;
  [[nodiscard]] planning::job_config planner_config(int nodes, int fault_tolerance) const;
  /// The simulated job of a case (step_scale: the contention model, empty for none). Like the
  /// replay (oobleck-local --trace without --checkpoint-dir), it has no checkpoint folder: below
  /// its minimum it waits with the survivors' memory only.
  [[nodiscard]] sim::sim_job sim_job_for(const replay_case& c, const std::vector<double>& step_scale) const;
};

/// A case's schedule as the simulator's cluster trace: its time scale, joins ready after ready_ms.
sim::cluster_trace cluster_trace_of(const replay_case& c, const sim::replay_schedule& s, double ready_ms);

/// A case as oobleck-local replayed it.
struct measured_replay {
  sim::replay_schedule schedule;
  double window_ms = 0, t0 = NAN, samples = 0, measured = 0;
  std::size_t replayed_events = 0;  // those before the end (the run ends at the trace's last time)
  std::vector<nlohmann::json> steps, records;
  std::vector<std::string> progress;  ///< for people: the job events of the window (losses, joins, epochs)
  double waited_ms = 0;               ///< the coordinator's waits below the minimum (its resumed records)
  int waits = 0, resumes = 0;         ///< its waiting_for_nodes and resumed records
  std::string load_before, load_after;
  /// Why the replay could not be measured (it stopped, formed no epoch): the case is reported as
  /// failed and the other cases still run. Empty when it was measured.
  std::string failure;
};

/// Predicts the case and prints the prediction against the measurement; its JSON, and its row of
/// the summary table in `row`.
nlohmann::ordered_json predict_case(const validation_job& v, const replay_case& c, const measured_replay& m,
                                    const std::vector<double>& step_scale, double join_ms, std::string& row);

}  // namespace oobleck::bench
