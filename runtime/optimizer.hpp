#pragma once
// AdamW per layer, so a layer's optimizer state travels with the layer when it is copied, and a
// step is a deterministic function of (parameters, gradients, state): replicas stay bitwise equal.

#include <torch/torch.h>

#include <cstdint>
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

/// One AdamW update of `params` from their .grad(); increments state.step.
void adamw_step(const std::vector<torch::Tensor>& params, layer_optimizer_state& state, const adamw_options& o);

}  // namespace oobleck::runtime
