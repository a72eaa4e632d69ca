#pragma once
// Splitting the global batch across heterogeneous pipelines (paper §4.2.2, without a MINLP solver).

#include <span>
#include <vector>

#include "planning/makespan.hpp"
#include "planning/profile.hpp"

namespace oobleck::planning {

struct batch_distribution {
  std::vector<int> microbatches;  ///< N_i per pipeline, each >= 1, summing to B / b
  std::vector<double> time_ms;    ///< T_i(N_i)
  double step_ms = 0;             ///< max_i T_i(N_i)
};

/// B / b, or planning_error recommending the nearest multiples of b when B is not one.
int microbatches_per_step(int global_batch, int microbatch);

/// Exact minimiser of max_i T_i(N_i) over integers N_i >= 1 with sum N_i = num_microbatches:
/// each next microbatch goes to the pipeline whose time after taking it is smallest (optimal for
/// nondecreasing per-pipeline times such as the 1F1B makespan; ties go to the lower index). Throws planning_error, with the
/// nearest distributable global batch, when there are more pipelines than microbatches.
batch_distribution distribute_batch(std::span<const pipeline_time> pipelines, int num_microbatches,
                                    int microbatch_size = 1);

}  // namespace oobleck::planning
