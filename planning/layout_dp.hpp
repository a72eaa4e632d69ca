#pragma once
// The dynamic program behind template_generator (see pipeline_template.hpp for the method).
// Internal to planning/.

#include <cstdint>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/ids.hpp"
#include "planning/pipeline_template.hpp"

namespace oobleck::planning::detail {

/// States (u, g, r): layers [u, L) remain to be placed on the last g GPUs in r stages.
/// Tables: `after` (stages after the bottleneck, cost 2w, w < c), `at` (the bottleneck stage itself,
/// cost (1 - r) c, w == c) and `before` (cost w, w <= c; also used alone by run_sum).
class layout_dp {
 public:
  layout_dp(const layer_costs& costs, int max_nodes);

  int max_stages() const { return max_r_; }

  /// min sum of w over layouts whose stages are all <= cap (cap = inf: feasibility and W_min),
  /// for up to node_limit nodes.
  void run_sum(double cap, int node_limit);
  /// Minimal sum after run_sum for n nodes; inf when infeasible.
  double front_sum(int nodes) const;
  /// Minimal sum after run_sum for n nodes in exactly `stages` stages; inf when infeasible.
  double front_sum(int nodes, int stages) const;

  /// The three-phase DP for bottleneck value `cap`, states with r > r_limit or more than
  /// `node_limit` nodes' GPUs skipped.
  void run_full(double cap, int r_limit, int node_limit);
  /// Minimal T over layouts of n nodes with bottleneck exactly cap, after run_full(cap, r_limit).
  double front_full(int nodes, double cap, int r_limit, int* stages = nullptr) const;
  /// The layout behind front_full.
  std::vector<stage_spec> trace_full(int nodes, int stages) const;

 private:
  enum class rule { below, at_most, equal };
  struct table {
    std::vector<double> value;
    std::vector<std::uint16_t> next_layer;
    std::vector<std::uint8_t> width_tag;
  };

  int row(int g, int r) const { return (r < 0 || r > max_r_) ? -1 : row_[g * (max_r_ + 1) + r]; }
  int min_stages(int g) const { return (g + gpus_per_node_ - 1) / gpus_per_node_; }
  int max_stages_for(int g) const { return g < num_layers_ ? g : num_layers_; }
  /// GPUs left in the node the next stage starts in, with g GPUs remaining overall.
  int node_room(int g) const { return g % gpus_per_node_ == 0 ? gpus_per_node_ : g % gpus_per_node_; }
  /// The cell of DP row `row_index` for the layers from `u` on.
  std::size_t at(int row_index, layer_index u) const {
    return static_cast<std::size_t>(row_index) * (num_layers_ + 1) + static_cast<std::size_t>(u.value);
  }
  /// Sets the rows of the first g_limit GPUs to inf (rows are stored in order of g).
  void reset(table& t, int g_limit);
  /// Recomputes cap_at_most_ / cap_below_ for a new bottleneck value.
  void set_cap(double cap);
  void relax(int g, int r, int d, double coef, double add, rule how, double cap, const table& next,
             table& out);

  const layer_costs& costs_;
  int num_layers_;
  int gpus_per_node_;
  int max_gpus_;
  int max_r_;
  std::vector<int> widths_;
  std::vector<int> row_;
  std::vector<int> rows_through_;  // [g]: rows of all g' <= g
  int rows_ = 0;
  table after_, at_, before_;
  struct window_entry {
    int v;
    double value;
  };
  std::vector<window_entry> window_;
  // Largest v such that stage [u, v) on width index i passes a bound (u when none does); each is
  // non-increasing as u decreases, which is what makes the window slide one way.
  std::vector<std::uint16_t> memory_hi_;    // [i][r][u]: fits with r stages from here on
  std::vector<std::uint16_t> cap_at_most_;  // [i][u]: w <= cap
  std::vector<std::uint16_t> cap_below_;    // [i][u]: w < cap
  double cap_ = -1;
};

}  // namespace oobleck::planning::detail
