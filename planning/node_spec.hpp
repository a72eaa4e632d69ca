#pragma once
// Node specification (paper §4.1.1, ARCHITECTURE.md §4): which node counts get a pipeline template.

#include <vector>

namespace oobleck::planning {

struct node_specification {
  int n0 = 0;     ///< fewest nodes that can hold the model
  int n_max = 0;  ///< min(L, N - f * n0)
  /// Node counts in [(f + 1) n0, N] that >= f + 1 pipelines of available templates cover exactly.
  std::vector<int> covered_node_counts;
};

/// n0 and n_max from which node counts can hold the model (feasible[n], n = 0 .. min(L, N)).
/// Throws planning_error when the model fits on no node count or N < (f + 1) n0.
node_specification specify_nodes(const std::vector<bool>& feasible, int num_layers, int nodes, int fault_tolerance);

/// Node counts in [lo, hi] that sums of >= min_pipelines template sizes cover exactly.
std::vector<int> covered_node_counts(const std::vector<int>& template_sizes, int min_pipelines, int lo, int hi);

/// The largest node count <= nodes that a sum of between min_pipelines (>= 1) and max_pipelines
/// template sizes covers exactly; 0 when none does.
int largest_covered_node_count(const std::vector<int>& template_sizes, int min_pipelines, int max_pipelines,
                               int nodes);

}  // namespace oobleck::planning
