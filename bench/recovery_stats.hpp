#pragma once
// The recovery benchmark's clock and its few statistics (bench/recovery*.cpp).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

namespace oobleck::bench {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

inline double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// The middle of the samples (the mean of the two middle ones for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline double max_of(const std::vector<double>& v) { return v.empty() ? NAN : *std::max_element(v.begin(), v.end()); }
inline double min_of(const std::vector<double>& v) { return v.empty() ? NAN : *std::min_element(v.begin(), v.end()); }

/// {"median", "min", "max", "n"} of the samples, as the benchmark's JSON summaries write them.
inline json stats(const std::vector<double>& v) {
  json o;
  o["median"] = median(v);
  o["min"] = min_of(v);
  o["max"] = max_of(v);
  o["n"] = v.size();
  return o;
}

}  // namespace oobleck::bench
