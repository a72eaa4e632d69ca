#pragma once
// Pipeline instantiation (paper §4.2, ARCHITECTURE.md §4): how many pipelines of each template to run on
// N' nodes, chosen for the shortest step after batch distribution.

#include <optional>
#include <span>
#include <vector>

#include "planning/batch_distribution.hpp"

namespace oobleck::planning {

/// A template as instantiation sees it: its node count and predicted T(Nb).
struct template_option {
  int nodes = 0;
  pipeline_time time;
};

struct instantiation {
  std::vector<int> template_nodes;  ///< node count of each pipeline, largest first
  batch_distribution batch;         ///< microbatches and times, same order
};

/// The instantiation of exactly `nodes` nodes with >= min_pipelines pipelines (and no more
/// pipelines than microbatches) whose step time after distribute_batch is minimal; nullopt when
/// no such combination exists. Exact for any nondecreasing T(Nb), as the 1F1B makespan is.
///
/// Not an enumeration of partitions: for a threshold T, a pipeline of template j can take
/// cap_j(T) microbatches finishing below T, and a knapsack DP over (nodes, pipelines) maximises the
/// total capacity; some combination beats T iff that maximum reaches B/b. Starting from any
/// covering, T is replaced by the step time of the DP's combination until no combination beats it.
std::optional<instantiation> instantiate(std::span<const template_option> templates, int nodes, int min_pipelines,
                                         int num_microbatches);

/// Fewest pipelines (>= min_pipelines) whose template sizes sum to `nodes`; nullopt if none.
std::optional<int> fewest_pipelines(std::span<const template_option> templates, int nodes, int min_pipelines);

}  // namespace oobleck::planning
