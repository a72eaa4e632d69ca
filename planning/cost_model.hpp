#pragma once
// The cost and memory model of ARCHITECTURE.md §4 as pure functions over a profile.

#include <cstdint>
#include <span>
#include <vector>

#include "planning/ids.hpp"
#include "planning/profile.hpp"

namespace oobleck::planning {

/// How memory is accounted: state bytes = param_bytes * state_factor (fp32 weights, grads and two
/// Adam moments by default).
struct memory_model {
  double device_memory_bytes = 0;
  double state_factor = 4.0;
};

/// Prefix sums over a profile, so a stage's latency and memory are O(1). Every component that
/// compares stage latencies (generator, cost model, tests) reads them from here, so equal stages
/// compare equal bit for bit.
class layer_costs {
 public:
  layer_costs(const profile& p, memory_model memory);

  int num_layers() const { return num_layers_; }
  int gpus_per_node() const { return gpus_per_node_; }
  const memory_model& memory() const { return memory_; }

  /// w = sum over layers [u, v) of forward + backward at width d.
  double stage_ms(layer_index u, layer_index v, int d) const;
  /// The forward and the backward part of w, each summed over the layers (for the 1F1B makespan).
  double forward_ms(layer_index u, layer_index v, int d) const;
  double backward_ms(layer_index u, layer_index v, int d) const;

  /// Whether stage [u, v) on d GPUs fits when `in_flight` = S - k microbatches are retained:
  /// state/d + in_flight * activations/d <= device memory.
  bool stage_fits(layer_index u, layer_index v, int d, int in_flight) const;

  std::int64_t param_bytes(layer_index u, layer_index v) const { return param_prefix_[v.value] - param_prefix_[u.value]; }
  /// AdamW over the parameters of layers [u, v) (the profile's optimizer_ms, summed).
  double optimizer_ms(layer_index u, layer_index v) const {
    return optimizer_prefix_[v.value] - optimizer_prefix_[u.value];
  }
  /// Bytes of layer l's output per microbatch (and of its gradient).
  std::int64_t output_bytes(layer_index l) const { return output_bytes_[l.value]; }
  /// The link between two nodes (all zero: communication is free).
  const link_profile& link() const { return link_; }
  /// Per layer of [u, v): a ring all-reduce of its gradient over `holders` ranks, one after
  /// another: 2 (g - 1) messages of param_bytes / g each (reduce-scatter then all-gather).
  /// 0 for g <= 1 or a free link.
  double allreduce_ms(layer_index u, layer_index v, int holders) const;
  /// What a node does for layers [u, v) after its pipeline's schedule: their gradient all-reduce
  /// over `holders` ranks (allreduce_ms), then AdamW (optimizer_ms).
  double synchronisation_ms(layer_index u, layer_index v, int holders) const {
    return allreduce_ms(u, v, holders) + optimizer_ms(u, v);
  }

  /// Prefix sums of forward + backward at width d: stage_ms(u, v, d) == pre[v] - pre[u].
  const std::vector<double>& time_prefix(int d) const { return time_prefix_[width_index(d)]; }

 private:
  int num_layers_;
  int gpus_per_node_;
  memory_model memory_;
  std::vector<std::vector<double>> time_prefix_;  // [width index][v]
  std::vector<std::vector<double>> forward_prefix_;
  std::vector<std::vector<double>> backward_prefix_;
  std::vector<std::int64_t> param_prefix_;
  std::vector<double> state_prefix_;
  std::vector<double> act_prefix_;
  std::vector<double> optimizer_prefix_;
  std::vector<std::int64_t> output_bytes_;
  link_profile link_;
};

/// The paper's closed form below ranks templates only (ARCHITECTURE.md §4): it underestimates the 1F1B
/// makespan for Nb < 4S and goes negative for Nb < S. Predicted times use pipeline_time
/// (makespan.hpp).

/// Index of the pipeline's bottleneck: the last stage with maximal latency (k*).
int bottleneck_stage(std::span<const double> stage_ms);

/// T(Nb) = sum w + (Nb - S + k* - 1) * w* + sum_{k >= k*} w.
double iteration_time(std::span<const double> stage_ms, int num_microbatches);

/// T with Nb = 4S, the value templates are ranked by.
double ranking_time(std::span<const double> stage_ms);

}  // namespace oobleck::planning
