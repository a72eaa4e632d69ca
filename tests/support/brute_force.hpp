#pragma once
// Exhaustive reference implementations for small planning instances: what the fast algorithms
// must agree with.

#include <algorithm>
#include <functional>
#include <map>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/profile.hpp"
#include "planning/schedule.hpp"

namespace oobleck::testing {

/// Calls visit(widths) for every ordered sequence of power-of-two widths that fills n nodes of M
/// GPUs node by node.
inline void for_each_width_sequence(int nodes, int gpus_per_node,
                                    const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> seq;
  std::function<void(int, int)> rec = [&](int node, int used) {
    if (node == nodes) {
      visit(seq);
      return;
    }
    for (int d = 1; d <= gpus_per_node - used; d *= 2) {
      seq.push_back(d);
      if (used + d == gpus_per_node) rec(node + 1, 0);
      else rec(node, used + d);
      seq.pop_back();
    }
  };
  rec(0, 0);
}

/// Calls visit(bounds) for every split of L layers into s non-empty contiguous ranges
/// (bounds has s + 1 entries, 0 .. L).
inline void for_each_layer_split(int layers, int s, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> b{0};
  std::function<void()> rec = [&] {
    const int placed = static_cast<int>(b.size()) - 1;
    if (placed == s - 1) {
      b.push_back(layers);
      visit(b);
      b.pop_back();
      return;
    }
    for (int v = b.back() + 1; v <= layers - (s - 1 - placed); ++v) {
      b.push_back(v);
      rec();
      b.pop_back();
    }
  };
  if (s <= layers) rec();
}

/// Minimal T(4S) over every memory-feasible layout of n nodes; nullopt when none fits.
inline std::optional<double> brute_force_best_time(const planning::layer_costs& costs, int nodes) {
  std::optional<double> best;
  const int L = costs.num_layers();
  for_each_width_sequence(nodes, costs.gpus_per_node(), [&](const std::vector<int>& widths) {
    const int s = static_cast<int>(widths.size());
    for_each_layer_split(L, s, [&](const std::vector<int>& b) {
      std::vector<double> w(s);
      for (int k = 0; k < s; ++k) {
        if (!costs.stage_fits(planning::layer_index{b[k]}, planning::layer_index{b[k + 1]}, widths[k], s - k)) return;
        w[k] = costs.stage_ms(planning::layer_index{b[k]}, planning::layer_index{b[k + 1]}, widths[k]);
      }
      const double t = planning::ranking_time(w);
      if (!best || t < *best) best = t;
    });
  });
  return best;
}

/// A random profile with small integer times (so ties are exact and frequent).
inline planning::profile random_profile(std::mt19937& rng, int layers, int gpus_per_node) {
  planning::profile p;
  p.model = "random";
  p.microbatch_size = 1;
  p.gpus_per_node = gpus_per_node;
  p.device_memory_bytes = 1;  // callers set a real limit
  std::uniform_int_distribution<int> ms(0, 9), bytes(1, 100);
  for (int l = 0; l < layers; ++l) {
    planning::layer_profile layer;
    layer.name = "l" + std::to_string(l);
    for (int d = 1; d <= gpus_per_node; d *= 2) {
      layer.forward_ms.push_back(ms(rng));
      layer.backward_ms.push_back(ms(rng) + 1);
    }
    layer.param_bytes = bytes(rng);
    layer.activation_bytes = bytes(rng);
    p.layers.push_back(layer);
  }
  return p;
}

/// The makespan of the 1F1B op lists of planning::one_f_one_b, by event simulation: each stage runs
/// its own op list in order, one op at a time; a compute op starts once the stage is free and the
/// op it depends on has ended (F(s - 1, i) for F(s, i), B(s + 1, i) for B(s, i)); transfers take no
/// time. Stages take turns until every list is done, so nothing here knows the schedule's shape.
inline double simulate_1f1b(const std::vector<double>& forward_ms, const std::vector<double>& backward_ms,
                            int microbatches) {
  const int S = static_cast<int>(forward_ms.size());
  std::vector<std::vector<planning::schedule_op>> ops;
  for (int s = 0; s < S; ++s) ops.push_back(planning::one_f_one_b(s, S, microbatches));
  std::map<std::tuple<int, int, int>, double> end;  // (kind, stage, microbatch) -> end time
  const int fwd = static_cast<int>(planning::op_kind::forward), bwd = static_cast<int>(planning::op_kind::backward);
  std::vector<std::size_t> pc(S, 0);
  std::vector<double> clock(S, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; ++s)
      for (; pc[s] < ops[s].size(); ++pc[s], progress = true) {
        const auto& op = ops[s][pc[s]];
        if (op.kind != planning::op_kind::forward && op.kind != planning::op_kind::backward) continue;
        const bool is_fwd = op.kind == planning::op_kind::forward;
        double ready = 0;
        const int dep_stage = is_fwd ? s - 1 : s + 1;
        if (dep_stage >= 0 && dep_stage < S) {
          auto it = end.find({is_fwd ? fwd : bwd, dep_stage, op.microbatch});
          if (it == end.end()) break;  // blocked on the other stage
          ready = it->second;
        }
        clock[s] = std::max(clock[s], ready) + (is_fwd ? forward_ms[s] : backward_ms[s]);
        end[{is_fwd ? fwd : bwd, s, op.microbatch}] = clock[s];
      }
  }
  for (int s = 0; s < S; ++s)
    if (pc[s] != ops[s].size()) throw std::logic_error("simulate_1f1b: the op lists deadlock");
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace oobleck::testing
