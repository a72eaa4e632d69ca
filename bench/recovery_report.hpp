#pragma once
// The recovery benchmark's report of its fault scenarios: the per-fault tables, the fit of copy
// time against bytes, and the figures its targets and the recovery-costs file are read from.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "bench/recovery_faults.hpp"
#include "bench/recovery_stats.hpp"

namespace oobleck::bench {

/// Prints the three tables: per fault, where the copies go, where the downtime goes.
void print_fault_tables(const std::vector<fault_result>& results);

/// copy_ms against the busiest link's bytes: a fixed part (mesh, views) and a marginal bandwidth,
/// by Theil-Sen over the events whose copy plan matched the record (NaN: not enough sizes).
struct copy_fit {
  double fixed_ms = NAN, bytes_per_ms = NAN;
  std::size_t points = 0;
};
copy_fit fit_copy_time(const std::vector<fault_result>& results);

bool is_crash(const fault_result& r);

/// The figures of all faults that the targets judge.
struct fault_summary {
  std::vector<double> crash_detect, crash_lost, hang_default, hang_short, decisions;
  std::vector<double> bandwidths;  ///< per link: the busiest link's bytes / the slowest node's copy_ms, GB/s
  std::vector<double> bandwidths_all;  ///< every link's bytes / the slowest node's copy_ms, GB/s
  /// The same two over the host transport's p2p bandwidth for the event's busiest link's bytes
  /// (events with a reference only).
  std::vector<double> bandwidth_ratios, bandwidth_all_ratios;
  /// The same two of the events whose busiest link moved >= 4 MiB (the rest are mostly latency) and
  /// whose workers outnumbered this machine's cores.
  std::vector<double> large_bandwidth_ratios, large_bandwidth_all_ratios;
  /// The busiest link's ratio of the events whose busiest link moved >= 4 MiB and whose workers each
  /// had a core of their own (own_cores).
  std::vector<double> own_core_bandwidth_ratios;
  int bound_met = 0, bound_total = 0;
};
fault_summary summarize(const std::vector<fault_result>& results);

/// Prints the targets (worst case over the events); their JSON. The copy bandwidth targets need
/// the events' p2p references (none: no bandwidth target). single_p2p: the one figure the
/// benchmark compared every event with before (the size nearest the mean copy's bytes), printed
/// beside them.
json print_targets(const fault_summary& s, std::optional<std::pair<double, std::int64_t>> single_p2p);

}  // namespace oobleck::bench
