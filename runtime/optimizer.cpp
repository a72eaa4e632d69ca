#include "runtime/optimizer.hpp"

#include <cmath>

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

}  // namespace oobleck::runtime
