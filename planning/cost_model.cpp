#include "planning/cost_model.hpp"

#include <cassert>

namespace oobleck::planning {

layer_costs::layer_costs(const profile& p, memory_model memory)
    : num_layers_(p.num_layers()), gpus_per_node_(p.gpus_per_node), memory_(memory), link_(p.link) {
  validate(p);
  const auto widths = stage_widths(p.gpus_per_node);
  time_prefix_.assign(widths.size(), std::vector<double>(num_layers_ + 1, 0.0));
  forward_prefix_ = backward_prefix_ = time_prefix_;
  param_prefix_.assign(num_layers_ + 1, 0);
  state_prefix_.assign(num_layers_ + 1, 0.0);
  act_prefix_.assign(num_layers_ + 1, 0.0);
  optimizer_prefix_.assign(num_layers_ + 1, 0.0);
  for (int l = 0; l < num_layers_; ++l) {
    const auto& layer = p.layers[l];
    for (std::size_t i = 0; i < widths.size(); ++i) {
      time_prefix_[i][l + 1] = time_prefix_[i][l] + layer.forward_ms[i] + layer.backward_ms[i];
      forward_prefix_[i][l + 1] = forward_prefix_[i][l] + layer.forward_ms[i];
      backward_prefix_[i][l + 1] = backward_prefix_[i][l] + layer.backward_ms[i];
    }
    param_prefix_[l + 1] = param_prefix_[l] + layer.param_bytes;
    state_prefix_[l + 1] = state_prefix_[l] + static_cast<double>(layer.param_bytes) * memory_.state_factor;
    act_prefix_[l + 1] = act_prefix_[l] + static_cast<double>(layer.activation_bytes);
    optimizer_prefix_[l + 1] = optimizer_prefix_[l] + layer.optimizer_ms;
    output_bytes_.push_back(layer.output_bytes);
  }
}

double layer_costs::allreduce_ms(layer_index u, layer_index v, int holders) const {
  if (holders <= 1 || link_ == link_profile{}) return 0;
  double t = 0;
  for (int l = u.value; l < v.value; ++l) {
    const auto layer_bytes = param_prefix_[l + 1] - param_prefix_[l];
    t += 2.0 * (holders - 1) * link_.message_ms((layer_bytes + holders - 1) / holders);
  }
  return t;
}

double layer_costs::stage_ms(layer_index u, layer_index v, int d) const {
  const auto& pre = time_prefix_[width_index(d)];
  return pre[v.value] - pre[u.value];
}

double layer_costs::forward_ms(layer_index u, layer_index v, int d) const {
  const auto& pre = forward_prefix_[width_index(d)];
  return pre[v.value] - pre[u.value];
}

double layer_costs::backward_ms(layer_index u, layer_index v, int d) const {
  const auto& pre = backward_prefix_[width_index(d)];
  return pre[v.value] - pre[u.value];
}

bool layer_costs::stage_fits(layer_index u, layer_index v, int d, int in_flight) const {
  const double state = state_prefix_[v.value] - state_prefix_[u.value];
  const double act = act_prefix_[v.value] - act_prefix_[u.value];
  return (state + in_flight * act) / d <= memory_.device_memory_bytes;
}

int bottleneck_stage(std::span<const double> stage_ms) {
  assert(!stage_ms.empty());
  int k = 0;
  for (int i = 1; i < static_cast<int>(stage_ms.size()); ++i)
    if (stage_ms[i] >= stage_ms[k]) k = i;
  return k;
}

double iteration_time(std::span<const double> stage_ms, int num_microbatches) {
  const int s = static_cast<int>(stage_ms.size());
  const int k = bottleneck_stage(stage_ms);
  double total = 0, tail = 0;
  for (int i = 0; i < s; ++i) {
    total += stage_ms[i];
    if (i >= k) tail += stage_ms[i];
  }
  const double w = stage_ms[k];
  return total + (num_microbatches - s + k - 1) * w + tail;
}

double ranking_time(std::span<const double> stage_ms) {
  return iteration_time(stage_ms, 4 * static_cast<int>(stage_ms.size()));
}

}  // namespace oobleck::planning
