#pragma once
// Small text helpers the benchmarks share for their tables.

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

}  // namespace oobleck::bench
