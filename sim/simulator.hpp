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
  /// The policy's own failure-free rate: samples/s of its first configuration ("start"); 0 if
  /// it never started.
  double failure_free_samples_per_s = 0;
};

/// Effective training time share: the samples completed over what the policy's failure-free
/// configuration completes in the same wall time (Llama 3's "effective training time" when the
/// rate never changes; a shrunk batch or a slower configuration counts in proportion). 0 when
/// the policy never started.
double effective_share(const policy_result& r);

/// Wall time lost per cause (ms), summing with the effective time to the duration: the
/// timeline's activities other than effective, and `slower` = effective stretches' time beyond
/// what their samples take at the failure-free rate (a shrunk batch, a slower configuration).
struct time_lost {
  double fallback = 0, reconfiguration = 0, checkpoint = 0, restart = 0, stopped = 0, redundant = 0, slower = 0;
  double effective = 0;  ///< samples / failure-free rate
};
time_lost lost_time(const policy_result& r);

/// Replays the trace's changes up to end_ms (changes at or after it are ignored) through the
/// policy. At most `max_nodes` nodes are given to the job at once; later-ready nodes wait as spares
/// and replace lost ones in the same change.
policy_result simulate(policy& p, const cluster_trace& trace, double end_ms, int max_nodes);

/// Throughput in `bins` equal windows of [start_ms, end_ms): samples completed per second in each
/// (a stretch's samples are spread evenly over it).
std::vector<double> throughput_series(const policy_result& r, int bins);

}  // namespace oobleck::sim
