#pragma once
// Small text helpers the benchmarks share for their tables.

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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

/// The file that this process's `malloc` comes from ("libtcmalloc_minimal.so.4", "libc.so.6"; "" if
/// unknown): the allocator of this build's programs (CMakeLists.txt, OOBLECK_ALLOCATOR), or one
/// preloaded. Benchmarks record it beside their figures.
inline std::string allocator_in_use() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&std::malloc), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  return path.substr(path.find_last_of('/') + 1);
}

/// The keys of a metrics step record's "breakdown" (README, "--metrics-out"), in table order.
inline constexpr const char* breakdown_keys[] = {"compute_ms",   "p2p_wait_ms", "allreduce_ms",
                                                 "optimizer_ms", "control_ms",  "other_ms"};

}  // namespace oobleck::bench
