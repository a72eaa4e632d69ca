#pragma once
// The recovery benchmark's report of its fault scenarios: the per-fault tables, the fit of copy
// time against bytes, and the figures its targets and the recovery-costs file are read from.

#include <cmath>
#include <cstddef>
#include <optional>
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
  int bound_met = 0, bound_total = 0;
};
fault_summary summarize(const std::vector<fault_result>& results);

/// Prints the targets (worst case over the events); their JSON. p2p_gb: the host transport's
/// bandwidth (none: no bandwidth target).
json print_targets(const fault_summary& s, std::optional<double> p2p_gb);

}  // namespace oobleck::bench
