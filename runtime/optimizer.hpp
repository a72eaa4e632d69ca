#pragma once
// AdamW per layer, so a layer's optimizer state travels with the layer when it is copied, and a
// step is a deterministic function of (parameters, gradients, state): replicas stay bitwise equal.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace oobleck::runtime {

/// Linear warm-up to `peak`, then cosine decay to peak * min_ratio at `total_steps`, then flat.
struct lr_schedule {
  double peak = 1e-3;
  std::int64_t warmup_steps = 10;
  std::int64_t total_steps = 1000;
  double min_ratio = 0.1;
  /// Learning rate of the step-th update (1-based).
  double at(std::int64_t step) const;
};

struct adamw_options {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  ///< applied to matrices only (dim >= 2), not to biases and norms
  lr_schedule lr;
};

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
