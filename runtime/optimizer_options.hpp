#pragma once
// AdamW's knobs and the learning-rate schedule, without LibTorch: the job file (apps/) fills them,
// runtime/optimizer applies them. The learning rate is a pure function of the update count, so a
// layer copied during a reconfiguration carries on at the same point of the schedule (its step
// count travels with its optimizer state, ARCHITECTURE.md §5).

#include <cstdint>
#include <optional>
#include <string_view>

namespace oobleck::runtime {

/// The shape of the learning rate after the warm-up.
enum class lr_decay {
  constant,  ///< stays at the peak
  linear,    ///< straight line from the peak down to min_lr at total_steps
  cosine,    ///< half a cosine from the peak down to min_lr at total_steps
};

/// Linear warm-up from 0 to `peak` over the first `warmup_steps` updates, then `decay` down to
/// `min_lr` at update `total_steps`, then flat at min_lr (constant: flat at the peak).
struct lr_schedule {
  double peak = 1e-3;
  std::uint64_t warmup_steps = 10;
  std::uint64_t total_steps = 1000;
  double min_lr = 1e-4;
  lr_decay decay = lr_decay::cosine;

  bool operator==(const lr_schedule&) const = default;
};

/// The learning rate of the step-th update, 1-based (layer_optimizer_state::step after the
/// update): training step k (0-based) applies learning_rate(s, k + 1).
double learning_rate(const lr_schedule& s, std::uint64_t step);

/// "constant", "linear", "cosine".
std::string_view lr_decay_name(lr_decay d);
/// The decay a name gives; nullopt for any other text.
std::optional<lr_decay> parse_lr_decay(std::string_view text);

struct adamw_options {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  ///< applied to matrices only (dim >= 2), not to biases and norms
  lr_schedule lr;
  /// Gradient clipping by the global norm over every parameter (a tied matrix counted once): the
  /// gradients are scaled by clip_norm / (norm + 1e-6) when that is below 1, as PyTorch's
  /// clip_grad_norm_ does. 0: off.
  double clip_norm = 0;

  bool operator==(const adamw_options&) const = default;
};

/// The factor global-norm clipping multiplies the gradients by: clip_norm / (norm + 1e-6) when that
/// is below 1, else 1 (PyTorch's clip_grad_norm_); 1 when clip_norm is 0 (off).
inline double clip_scale(double clip_norm, double norm) {
  if (clip_norm <= 0) return 1;
  const double s = clip_norm / (norm + 1e-6);
  return s < 1 ? s : 1;
}

}  // namespace oobleck::runtime
