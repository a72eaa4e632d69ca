#pragma once
// Where a committed step's wall time went (the "breakdown" of a --metrics-out record). The
// coordinator times the step's two round trips on its own clock and subtracts the work the stages
// report on theirs (durations only, so no clock needs to agree with another):
//
//   T0 run_step sent to every pipeline ... T1 the last pipeline_done ... T2 the last step_committed
//
//   run phase    T1 - T0 = slowest stage's busy_ms + control (run)
//   commit phase T2 - T1 = slowest node's commit_ms + control (commit)
//
// The slowest stage is the one with the largest busy_ms (receiving stage_step to replying) over all
// pipelines; its busy time splits into compute, p2p wait, all-reduce wait and the rest (sampling,
// slicing the batch). The slowest commit is the node with the largest commit_ms; it splits into
// optimizer (AdamW) and the rest (parameter digests). control_ms = control (run) + control
// (commit) is what the messages cost: the coordinator -> pipeline actor -> stage fan-out of the
// step and the replies back, then commit_step -> monitor -> stage and step_committed back. For
// each phase it is at least the critical stage's own messaging latency and at most the largest
// messaging latency of any stage (a stage that starts late makes its neighbours wait, which they
// count as p2p wait). So wall_ms = compute + p2p_wait + allreduce + optimizer + control + other
// - ahead_ms, where ahead_ms is 0 unless the step's orders went out with the previous commit
// (run-ahead): T0 is then before the previous step's T2, where the step's wall time starts.
// Private to actors/; no LibTorch.

#include <chrono>

#include "messages/step_messages.hpp"

namespace oobleck::actors {

/// Milliseconds; see above.
struct step_breakdown {
  double compute_ms = 0;
  double p2p_wait_ms = 0;
  double allreduce_ms = 0;
  double optimizer_ms = 0;
  double control_ms = 0;
  double other_ms = 0;
  /// A step whose orders rode with the previous commit (run-ahead): how long they were out before
  /// that commit completed. Its wall time starts there, its parts at the orders: they add up to
  /// wall_ms + ahead_ms. 0 otherwise.
  double ahead_ms = 0;
};

/// The coordinator's timestamps and the slowest reports of the step in progress.
struct step_clock {
  using clock = std::chrono::steady_clock;
  clock::time_point started;   ///< T0
  clock::time_point reported;  ///< T1
  messages::stage_timing slowest_stage;
  double slowest_commit_ms = 0;
  double slowest_commit_optimizer_ms = 0;
  double ahead_ms = 0;  ///< step_breakdown::ahead_ms

  void start(clock::time_point t0);
  void on_pipeline_done(const messages::pipeline_done& d, clock::time_point now);
  void on_step_committed(const messages::step_committed& c);
  /// The breakdown of a step whose last commit acknowledgement arrived at `t2`.
  step_breakdown finish(clock::time_point t2) const;
};

}  // namespace oobleck::actors
