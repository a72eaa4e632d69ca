#pragma once
// The cluster the multi-process equivalence test runs: two heterogeneous pipelines, one of one
// stage (3 microbatches) and one of two stages (5 microbatches), three processes.

#include <vector>

#include "runtime/stage_executor.hpp"

namespace oobleck::testing {

struct placed_stage {
  int pipeline;
  runtime::stage_position position;
};

struct scenario {
  std::vector<placed_stage> ranks;
  std::vector<int> microbatches;               ///< per pipeline
  std::vector<std::vector<int>> layer_groups;  ///< [layer]: ranks holding it
};

inline scenario multiprocess_scenario() {
  scenario s;
  s.ranks = {{0, {0, 6, 0, 1, -1, -1}}, {1, {0, 3, 0, 2, -1, 2}}, {1, {3, 6, 1, 2, 1, -1}}};
  s.microbatches = {3, 5};
  s.layer_groups = {{0, 1}, {0, 1}, {0, 1}, {0, 2}, {0, 2}, {0, 2}};
  return s;
}

}  // namespace oobleck::testing
