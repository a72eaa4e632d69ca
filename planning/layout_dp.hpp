#pragma once
// The dynamic program behind template_generator (see pipeline_template.hpp for the method).
// Internal to planning/.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/ids.hpp"
#include "planning/pipeline_template.hpp"

namespace oobleck::planning::detail {

/// States (u, g, r): layers [u, L) remain to be placed on the last g GPUs in r stages. A row is one
/// (g, r) pair some layout can reach (r in [ceil(g/M), min(g, L)]); each row holds L + 1 doubles per
/// table. Two tables: `after` (stages after the bottleneck, cost 2w, w < c) and `before` (the
/// bottleneck stage itself, cost w + (1 - r) c with w == c, and the stages before it, cost w,
/// w <= c; also used alone by run_sum). Only values are stored: a layout is rebuilt by recomputing
/// which transition gives each value (trace_*), so the tables take 16 bytes per cell.
class layout_dp {
 public:
  layout_dp(const layer_costs& costs, int max_nodes);

  /// Bytes a layout_dp(costs, max_nodes) allocates (its tables and indexes), computed from the
  /// same row count and row length without allocating; saturates at UINT64_MAX. `with_after`
  /// false: only what run_sum needs (the after table is allocated on the first run_full).
  static std::uint64_t bytes_needed(const layer_costs& costs, int max_nodes, bool with_after = true);

  int max_stages() const { return max_r_; }
  /// Row cells (L + 1 each) computed by the runs so far: the DP's work.
  std::uint64_t cells_computed() const { return cells_; }

  /// min sum of w over layouts whose stages are all <= cap (cap = inf: feasibility and W_min),
  /// for up to node_limit nodes.
  void run_sum(double cap, int node_limit);
  /// run_sum for the (node count, stage count) pairs in `stage_range` (as run_full's) only.
  void run_sum(double cap, const std::vector<std::pair<int, int>>& stage_range);
  /// Minimal sum after run_sum for n nodes; inf when infeasible.
  double front_sum(int nodes) const;
  /// Minimal sum after run_sum for n nodes in exactly `stages` stages; inf when infeasible.
  double front_sum(int nodes, int stages) const;

  /// A layout behind front_sum(nodes, stages) (every stage <= the run's cap), by recomputation.
  std::vector<stage_spec> trace_sum(int nodes, int stages) const;

  /// The three-phase DP for bottleneck value `cap`, for the (node count, stage count) pairs in
  /// `stage_range` (index n: stage counts [first, second] of n nodes wanted; first > second: none).
  /// Only the rows some wanted pair can reach are computed.
  void run_full(double cap, const std::vector<std::pair<int, int>>& stage_range);
  /// The same for every stage count <= r_limit of every node count <= node_limit.
  void run_full(double cap, int r_limit, int node_limit);
  /// Minimal T over layouts of n nodes with bottleneck exactly cap, after run_full(cap, ...), over
  /// stage counts <= r_limit the run covered.
  double front_full(int nodes, double cap, int r_limit, int* stages = nullptr) const;
  double front_full(int nodes, int stages, double cap) const;
  /// The layout behind front_full (by recomputation).
  std::vector<stage_spec> trace_full(int nodes, int stages) const;

 private:
  int row(int g, int r) const {
    if (g < 0 || r < 0) return -1;
    if (g == 0) return r == 0 ? 0 : -1;
    if (r < min_stages(g) || r > max_stages_for(g)) return -1;
    return row_start_[g] + (r - min_stages(g));
  }
  int min_stages(int g) const { return (g + gpus_per_node_ - 1) / gpus_per_node_; }
  int max_stages_for(int g) const { return std::min({g, num_layers_, max_r_}); }
  /// GPUs left in the node the next stage starts in, with g GPUs remaining overall.
  int node_room(int g) const { return g % gpus_per_node_ == 0 ? gpus_per_node_ : g % gpus_per_node_; }
  /// The cell of DP row `row_index` for the layers from `u` on.
  std::size_t at(int row_index, int u) const {
    return static_cast<std::size_t>(row_index) * (num_layers_ + 1) + static_cast<std::size_t>(u);
  }
  /// Recomputes cap_at_most_ / cap_below_ for a new bottleneck value.
  void set_cap(double cap);
  /// Largest v such that stage [u, v) on width index i with r stages left passes the memory check,
  /// the cap (`below`: w < cap, else w <= cap) and leaves >= r - 1 layers.
  int stage_end_limit(std::size_t i, int r, int u, bool below) const;
  /// First layer a row (g, r) of the last run holds: the S - r stages before it need >= S - r layers.
  int first_u(int g, int r) const { return std::max(0, s_min_[g] - r); }
  void relax(int g, int r, int d, double coef, bool below, const std::vector<double>& next, std::vector<double>& out);
  void relax_equal(int g, int r, int d, double add, const std::vector<double>& next, std::vector<double>& out);
  /// Sets a row's cells from first_u on to inf; counts them as computed.
  void clear_row(std::vector<double>& table, int g, int r);
  void compute_full_row(int g, int r);
  /// Sets r_lo_ / r_hi_ to the rows the pairs of stage_range reach; returns the last g with rows.
  int set_hull(const std::vector<std::pair<int, int>>& stage_range);

  const layer_costs& costs_;
  int num_layers_;
  int gpus_per_node_;
  int max_gpus_;
  int max_r_;
  std::vector<int> widths_;
  std::vector<int> row_start_;     // [g]: first row of g
  int rows_ = 0;
  std::vector<double> after_, before_;
  enum class last_run { none, sum, full } last_ = last_run::none;
  std::uint64_t cells_ = 0;
  struct window_entry {
    int v;
    double value;
  };
  std::vector<window_entry> window_;
  std::vector<int> r_lo_, r_hi_;  // [g]: rows of the last run
  std::vector<int> s_min_;        // [g]: fewest stages of the pairs the last run reaches g from
  // Largest v such that stage [u, v) on width index i passes a bound (u when none does); each is
  // non-increasing as u decreases, which is what makes the window slide one way.
  std::vector<std::uint16_t> memory_hi_;    // [i][r][u]: fits with r stages from here on
  std::vector<std::uint16_t> cap_at_most_;  // [i][u]: w <= cap
  std::vector<std::uint16_t> cap_below_;    // [i][u]: w < cap
  double cap_ = -1;
};

}  // namespace oobleck::planning::detail
