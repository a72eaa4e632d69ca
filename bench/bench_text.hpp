#pragma once
// Small text helpers the benchmarks share for their tables.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace oobleck::bench {

/// One printf-formatted number.
inline std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

/// The 1, 5 and 15 minute load averages as /proc/loadavg writes them ("" where it cannot be read).
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// The 1-minute load average as a number (NaN where /proc/loadavg cannot be read).
inline double load_average_1min() {
  std::ifstream in("/proc/loadavg");
  double l = NAN;
  in >> l;
  return l;
}

/// The keys of a metrics step record's "breakdown" (README, "--metrics-out"), in table order.
inline constexpr const char* breakdown_keys[] = {"compute_ms",   "p2p_wait_ms", "allreduce_ms",
                                                 "optimizer_ms", "control_ms",  "other_ms"};

}  // namespace oobleck::bench
