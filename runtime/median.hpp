#pragma once
// The median the profiler reports: the upper middle of the sorted samples (one of them, never an
// average of two), 0 for none.

#include <algorithm>
#include <vector>

namespace oobleck::runtime {

inline double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

}  // namespace oobleck::runtime
