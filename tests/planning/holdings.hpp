#pragma once
// Which layers each node holds under a set of pipelines: node -> its stage's layers [u, v).

#include <map>
#include <utility>
#include <vector>

#include "planning/planner.hpp"

namespace oobleck::testing {

inline std::map<planning::node_id, std::pair<int, int>> holdings_of(
    const planning::template_set& t, const std::vector<planning::pipeline_instance>& ps) {
  std::map<planning::node_id, std::pair<int, int>> out;
  for (const auto& p : ps)
    for (int i = 0; i < static_cast<int>(p.nodes.size()); ++i) {
      const auto [u, v] = t.find(p.template_nodes)->node_layers(i);
      out[p.nodes[i]] = {u.value, v.value};
    }
  return out;
}

}  // namespace oobleck::testing
