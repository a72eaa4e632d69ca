#pragma once
// AdamW per layer, so a layer's optimizer state travels with the layer when it is copied, and a
// step is a deterministic function of (parameters, gradients, state): replicas stay bitwise equal.

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/optimizer_options.hpp"

namespace oobleck::runtime {

/// The optimizer state of one layer: Adam moments per parameter and the update count.
struct layer_optimizer_state {
  std::vector<torch::Tensor> exp_avg;
  std::vector<torch::Tensor> exp_avg_sq;
  std::int64_t step = 0;
};

/// Zero moments shaped like `params`.
layer_optimizer_state initial_state(const std::vector<torch::Tensor>& params);

/// One AdamW update of `params` from their .grad(); increments state.step. Per tensor: for
/// parameters that are not laid end to end in flat buffers (the layer store's are: flat_adamw_step).
void adamw_step(const std::vector<torch::Tensor>& params, layer_optimizer_state& state, const adamw_options& o);

/// Element ranges [begin, end) of a flat buffer.
using element_ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// Where the matrices (dim >= 2: weight decay applies to them only) of `params` lie once the
/// tensors are laid end to end in this order; adjacent matrices form one range.
element_ranges matrix_ranges(const std::vector<torch::Tensor>& params);

/// A layer's tensors laid end to end in one 1-D buffer each (the layer store's layout).
struct flat_adamw_buffers {
  torch::Tensor parameters, gradients, exp_avg, exp_avg_sq;
};

/// The update adamw_step makes, over a layer's flat buffers at once: weight decay on each range of
/// `decayed` (sorted and disjoint, as matrix_ranges gives them; else std::invalid_argument before
/// anything changes), then the moments and the parameters. On the CPU (float32, four distinct
/// buffers) one pass over the buffers computes it element by element; elsewhere one tensor
/// operation per moment and one for the parameters over the whole buffer. Increments `step`.
void flat_adamw_step(const flat_adamw_buffers& buffers, const element_ranges& decayed, std::int64_t& step,
                     const adamw_options& o);

}  // namespace oobleck::runtime
