#pragma once
// Drives policies through a cluster trace and summarises what each achieved.

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "sim/policy.hpp"
#include "sim/trace.hpp"

namespace oobleck::sim {

/// What one policy achieved over [start_ms, end_ms).
struct policy_result {
  std::string policy;
  double start_ms = 0;
  double end_ms = 0;
  double samples = 0;
  double samples_per_s = 0;                       ///< samples / duration
  std::array<double, kActivities> breakdown_ms{};  ///< sums to the duration
  std::vector<segment> segments;
  std::vector<decision> decisions;
  std::string never_runs;  ///< e.g. out of memory
};

/// Replays the trace's changes up to end_ms (changes at or after it are ignored) through the
/// policy. At most `max_nodes` nodes are given to the job at once; later-ready nodes wait as spares
/// and replace lost ones in the same change.
policy_result simulate(policy& p, const cluster_trace& trace, double end_ms, int max_nodes);

/// Throughput in `bins` equal windows of [start_ms, end_ms): samples completed per second in each
/// (a stretch's samples are spread evenly over it).
std::vector<double> throughput_series(const policy_result& r, int bins);

}  // namespace oobleck::sim
