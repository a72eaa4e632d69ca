#pragma once
// The recovery benchmark's trace replay: a sample of a spot-instance trace's starting nodes on the
// local cluster, their removals sent as kills, time-scaled, against failure-free runs of the same
// window; their throughput over time, optionally plotted (gnuplot).

#include <string>

#include "bench/recovery_stats.hpp"

namespace oobleck::bench {

struct trace_replay_options {
  std::string bin;        ///< the folder of the programs
  std::string job_text;   ///< the job (its node count is set to the sample's)
  std::string trace_path;
  std::string plot_path;  ///< a PNG, or empty for no plot
  double time_scale = 0.005;
  bool quick = false;
};

/// Runs the replay and its failure-free runs and prints their report; the "trace_replay" JSON
/// (a "skipped" one when the trace file does not exist).
json run_trace_replay(const trace_replay_options& o);

}  // namespace oobleck::bench
