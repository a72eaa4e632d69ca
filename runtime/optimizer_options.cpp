#include "runtime/optimizer_options.hpp"

#include <cmath>
#include <numbers>

namespace oobleck::runtime {

double learning_rate(const lr_schedule& s, std::uint64_t step) {
  if (step <= s.warmup_steps && s.warmup_steps > 0)
    return s.peak * static_cast<double>(step) / static_cast<double>(s.warmup_steps);
  if (s.decay == lr_decay::constant) return s.peak;
  if (step >= s.total_steps) return s.min_lr;
  // Here warmup_steps < step < total_steps, so both differences are positive.
  const double progress =
      static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps);
  const double left = s.decay == lr_decay::linear ? 1 - progress : 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return s.min_lr + (s.peak - s.min_lr) * left;
}

std::string_view lr_decay_name(lr_decay d) {
  switch (d) {
    case lr_decay::constant: return "constant";
    case lr_decay::linear: return "linear";
    case lr_decay::cosine: return "cosine";
  }
  return "?";
}

std::optional<lr_decay> parse_lr_decay(std::string_view text) {
  for (auto d : {lr_decay::constant, lr_decay::linear, lr_decay::cosine})
    if (lr_decay_name(d) == text) return d;
  return std::nullopt;
}

}  // namespace oobleck::runtime
