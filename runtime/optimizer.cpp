#include "runtime/optimizer.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace oobleck::runtime {

layer_optimizer_state initial_state(const std::vector<torch::Tensor>& params) {
  layer_optimizer_state s;
  for (const auto& p : params) {
    s.exp_avg.push_back(torch::zeros_like(p));
    s.exp_avg_sq.push_back(torch::zeros_like(p));
  }
  return s;
}

void adamw_step(const std::vector<torch::Tensor>& params, layer_optimizer_state& state, const adamw_options& o) {
  torch::NoGradGuard no_grad;
  ++state.step;
  const double lr = learning_rate(o.lr, static_cast<std::uint64_t>(state.step));
  const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(state.step));
  const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(state.step));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.grad().defined()) continue;
    const auto& g = p.grad();
    if (o.weight_decay > 0 && p.dim() >= 2) p.mul_(1 - lr * o.weight_decay);
    state.exp_avg[i].mul_(o.beta1).add_(g, 1 - o.beta1);
    state.exp_avg_sq[i].mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    const auto denom = (state.exp_avg_sq[i] / bias2).sqrt_().add_(o.eps);
    p.addcdiv_(state.exp_avg[i], denom, -lr / bias1);
  }
}

element_ranges matrix_ranges(const std::vector<torch::Tensor>& params) {
  element_ranges out;
  std::int64_t offset = 0;
  for (const auto& p : params) {
    const auto end = offset + p.numel();
    if (p.dim() >= 2) {
      if (!out.empty() && out.back().second == offset) out.back().second = end;
      else out.emplace_back(offset, end);
    }
    offset = end;
  }
  return out;
}

void flat_adamw_step(const flat_adamw_buffers& b, const element_ranges& decayed, std::int64_t& step,
                     const adamw_options& o) {
  const auto n = b.parameters.numel();
  for (const auto* t : {&b.parameters, &b.gradients, &b.exp_avg, &b.exp_avg_sq})
    if (!t->defined() || t->dim() != 1 || t->numel() != n || !t->is_contiguous())
      throw std::invalid_argument("flat_adamw_step: parameters, gradients and moments must be contiguous 1-D "
                                  "buffers of " + std::to_string(n) + " elements");
  torch::NoGradGuard no_grad;
  ++step;
  const double lr = learning_rate(o.lr, static_cast<std::uint64_t>(step));
  const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  if (o.weight_decay > 0)
    for (const auto& [begin, end] : decayed) b.parameters.slice(0, begin, end).mul_(1 - lr * o.weight_decay);
  const auto& g = b.gradients;
  b.exp_avg.mul_(o.beta1).add_(g, 1 - o.beta1);
  b.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  // One temporary for the layer (the per-tensor step made one per tensor).
  const auto denom = (b.exp_avg_sq / bias2).sqrt_().add_(o.eps);
  b.parameters.addcdiv_(b.exp_avg, denom, -lr / bias1);
}

}  // namespace oobleck::runtime
