#include "planning/node_spec.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "planning/profile.hpp"

namespace oobleck::planning {

node_specification specify_nodes(const std::vector<bool>& feasible, int num_layers, int nodes, int fault_tolerance) {
  if (nodes < 1) throw planning_error("the job needs at least one node, got " + std::to_string(nodes));
  if (fault_tolerance < 0) throw planning_error("fault tolerance f must be >= 0, got " + std::to_string(fault_tolerance));
  node_specification spec;
  const int searched = std::min<int>(static_cast<int>(feasible.size()) - 1, std::min(num_layers, nodes));
  for (int n = 1; n <= searched && spec.n0 == 0; ++n)
    if (feasible[n]) spec.n0 = n;
  if (spec.n0 == 0)
    throw planning_error("the model does not fit in device memory on any pipeline of up to " +
                         std::to_string(searched) + " nodes; use devices with more memory or more GPUs per node");
  const int needed = (fault_tolerance + 1) * spec.n0;
  if (nodes < needed)
    throw planning_error("f = " + std::to_string(fault_tolerance) + " needs " + std::to_string(fault_tolerance + 1) +
                         " pipelines of at least n0 = " + std::to_string(spec.n0) + " nodes, i.e. " +
                         std::to_string(needed) + " nodes, but the job has " + std::to_string(nodes) +
                         "; lower f to " + std::to_string(nodes / spec.n0 - 1) + " or add nodes");
  spec.n_max = std::min(num_layers, nodes - fault_tolerance * spec.n0);
  std::vector<int> sizes;
  for (int n = spec.n0; n <= spec.n_max && n < static_cast<int>(feasible.size()); ++n)
    if (feasible[n]) sizes.push_back(n);
  spec.covered_node_counts = covered_node_counts(sizes, fault_tolerance + 1, needed, nodes);
  return spec;
}

std::vector<int> covered_node_counts(const std::vector<int>& template_sizes, int min_pipelines, int lo, int hi) {
  // reach[m][p]: m nodes covered by p pipelines, p saturating at min_pipelines.
  const int top = std::max(min_pipelines, 0);
  std::vector<std::vector<char>> reach(hi + 1, std::vector<char>(top + 1, 0));
  reach[0][0] = 1;
  for (int m = 0; m <= hi; ++m)
    for (int p = 0; p <= top; ++p) {
      if (!reach[m][p]) continue;
      for (int n : template_sizes)
        if (m + n <= hi) reach[m + n][std::min(p + 1, top)] = 1;
    }
  std::vector<int> out;
  for (int m = std::max(lo, 1); m <= hi; ++m)
    if (reach[m][top]) out.push_back(m);
  return out;
}

int largest_covered_node_count(const std::vector<int>& template_sizes, int min_pipelines, int max_pipelines,
                               int nodes) {
  const int top = std::max(min_pipelines, 1);
  if (nodes < 1 || max_pipelines < top) return 0;
  // fewest[m][q]: fewest pipelines covering m nodes among covers of saturated count q (<= top).
  constexpr int kNone = std::numeric_limits<int>::max();
  std::vector<std::vector<int>> fewest(nodes + 1, std::vector<int>(top + 1, kNone));
  fewest[0][0] = 0;
  for (int m = 0; m < nodes; ++m)
    for (int q = 0; q <= top; ++q) {
      if (fewest[m][q] == kNone) continue;
      for (int n : template_sizes)
        if (n >= 1 && m + n <= nodes) {
          int& next = fewest[m + n][std::min(q + 1, top)];
          next = std::min(next, fewest[m][q] + 1);
        }
    }
  for (int m = nodes; m >= 1; --m)
    if (fewest[m][top] <= max_pipelines) return m;
  return 0;
}

}  // namespace oobleck::planning
