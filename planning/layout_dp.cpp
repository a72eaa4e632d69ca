#include "planning/layout_dp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace oobleck::planning::detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

std::uint64_t layout_dp::bytes_needed(const layer_costs& costs, int max_nodes, bool with_after) {
  // Kept in step with the constructor and run_full's allocations.
  const double L = costs.num_layers();
  const double M = costs.gpus_per_node();
  const double G = static_cast<double>(max_nodes) * M;
  const double R = std::min(L, G);
  const double widths = static_cast<double>(stage_widths(costs.gpus_per_node()).size());
  const double cell_bytes = (L + 1) * sizeof(double) * (with_after ? 2 : 1);
  // rows = 1 + sum_{g=1..G} (min(g, R) - ceil(g/M) + 1), in closed form (G may be huge). Rows of
  // g > L M are empty (more than L stages), and below it every term is >= 1.
  const double budget = static_cast<double>(std::numeric_limits<std::uint64_t>::max());
  const double top = std::min(G, L * M);
  const double below_r = std::min(top, R);
  const double sum_min = below_r * (below_r + 1) / 2 + (top - below_r) * R;
  const double q = std::floor(top / M), rem = top - q * M;
  const double sum_ceil = M * q * (q + 1) / 2 + rem * (q + 1);
  const double rows = 1 + sum_min - sum_ceil + top;
  const double bytes = rows * cell_bytes + (G + 1) * 4 * sizeof(int) + widths * (R + 1) * L * 2 +
                       2 * widths * L * 2 + (L + 2) * sizeof(window_entry);
  return bytes >= budget ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(bytes);
}

layout_dp::layout_dp(const layer_costs& costs, int max_nodes)
    : costs_(costs),
      num_layers_(costs.num_layers()),
      gpus_per_node_(costs.gpus_per_node()),
      max_gpus_(max_nodes * costs.gpus_per_node()),
      max_r_(std::min(costs.num_layers(), max_nodes * costs.gpus_per_node())),
      widths_(stage_widths(costs.gpus_per_node())) {
  // Only (g, r) pairs some layout can reach get a row: r in [ceil(g/M), min(g, L)], stored by g.
  row_start_.assign(max_gpus_ + 1, 0);
  rows_ = 1;  // row 0: (0, 0)
  for (int g = 1; g <= max_gpus_; ++g) {
    row_start_[g] = rows_;
    rows_ += std::max(0, max_stages_for(g) - min_stages(g) + 1);
  }
  r_lo_.assign(max_gpus_ + 1, 0);
  r_hi_.assign(max_gpus_ + 1, -1);
  s_min_.assign(max_gpus_ + 1, 0);
  before_.assign(static_cast<std::size_t>(rows_) * (num_layers_ + 1), kInf);
  window_.resize(num_layers_ + 2);
  const int L = num_layers_;
  memory_hi_.assign(widths_.size() * (max_r_ + 1) * L, 0);
  for (std::size_t i = 0; i < widths_.size(); ++i)
    for (int r = 1; r <= max_r_; ++r) {
      int hi = L;
      for (int u = L - 1; u >= 0; --u) {
        hi = std::max(hi, u);
        while (hi > u && !costs_.stage_fits(layer_index{u}, layer_index{hi}, widths_[i], r)) --hi;
        memory_hi_[(i * (max_r_ + 1) + r) * L + u] = static_cast<std::uint16_t>(hi);
      }
    }
  cap_at_most_.assign(widths_.size() * L, 0);
  cap_below_.assign(widths_.size() * L, 0);
}

void layout_dp::set_cap(double cap) {
  if (cap == cap_) return;
  cap_ = cap;
  const int L = num_layers_;
  for (std::size_t i = 0; i < widths_.size(); ++i) {
    const auto& pre = costs_.time_prefix(widths_[i]);
    int at_most = L, below = L;
    for (int u = L - 1; u >= 0; --u) {
      while (at_most > u && !(pre[at_most] - pre[u] <= cap)) --at_most;
      while (below > u && !(pre[below] - pre[u] < cap)) --below;
      cap_at_most_[i * L + u] = static_cast<std::uint16_t>(at_most);
      cap_below_[i * L + u] = static_cast<std::uint16_t>(below);
    }
  }
}

int layout_dp::stage_end_limit(std::size_t i, int r, int u, bool below) const {
  const int L = num_layers_;
  const int memory = memory_hi_[(i * (max_r_ + 1) + r) * L + u];
  const int capped = (below ? cap_below_ : cap_at_most_)[i * L + u];
  return std::min({memory, capped, L - (r - 1)});
}

// out[u] = min(out[u], min_{v in window(u)} coef * w(u, v, d) + next[v]) for the stage [u, v) on d
// GPUs with r stages remaining. window(u) = [u + 1, hi(u)], where hi(u) is the largest v whose
// stage passes the cap and the memory check and leaves >= r - 1 layers; hi is non-increasing as u
// decreases, so a monotone deque gives every window minimum in O(1) amortised.
void layout_dp::relax(int g, int r, int d, double coef, bool below, const std::vector<double>& next,
                      std::vector<double>& out) {
  const int next_row = row(g - d, r - 1);
  if (next_row < 0) return;
  const auto& pre = costs_.time_prefix(d);
  const double* next_value = &next[at(next_row, 0)];
  double* out_value = &out[at(row(g, r), 0)];
  const auto i = static_cast<std::size_t>(width_index(d));
  const int last_v = num_layers_ - (r - 1);
  const int L = num_layers_;
  const std::uint16_t* memory_hi = &memory_hi_[(i * (max_r_ + 1) + r) * L];
  const std::uint16_t* cap_hi = &(below ? cap_below_ : cap_at_most_)[i * L];
  int front = num_layers_ + 1, back = num_layers_ + 1;  // deque window_[front, back), newest at front
  const int u_lo = first_u(g, r);
  for (int u = last_v - 1; u >= u_lo; --u) {
    const int hi = std::min<int>({memory_hi[u], cap_hi[u], last_v});
    // v = u + 1 enters the window (if the window reaches it); entries beyond hi leave.
    if (u + 1 <= hi) {
      const double base = coef * pre[u + 1] + next_value[u + 1];
      while (front < back && window_[front].value >= base) ++front;
      window_[--front] = {u + 1, base};
    }
    while (front < back && window_[back - 1].v > hi) --back;
    if (front == back) continue;
    const double candidate = window_[back - 1].value - coef * pre[u];
    if (candidate < out_value[u]) out_value[u] = candidate;
  }
}

// The bottleneck stage: w(u, v, d) == cap exactly, value next[v] + add.
void layout_dp::relax_equal(int g, int r, int d, double add, const std::vector<double>& next, std::vector<double>& out) {
  const int next_row = row(g - d, r - 1);
  if (next_row < 0) return;
  const auto& pre = costs_.time_prefix(d);
  const double* next_value = &next[at(next_row, 0)];
  double* out_value = &out[at(row(g, r), 0)];
  const auto i = static_cast<std::size_t>(width_index(d));
  for (int u = num_layers_ - r; u >= first_u(g, r); --u) {
    for (int v = stage_end_limit(i, r, u, false); v > u && pre[v] - pre[u] == cap_; --v) {
      const double candidate = next_value[v] + add;
      if (candidate < out_value[u]) out_value[u] = candidate;
    }
  }
}

void layout_dp::run_sum(double cap, int node_limit) {
  set_cap(cap);
  last_ = last_run::sum;
  const int g_limit = std::min(max_gpus_, node_limit * gpus_per_node_);
  for (int g = 1; g <= max_gpus_; ++g) {
    r_lo_[g] = min_stages(g);
    r_hi_[g] = g <= g_limit ? max_stages_for(g) : -1;
    s_min_[g] = 0;
  }
  std::fill(before_.begin(), before_.begin() + (num_layers_ + 1), kInf);
  before_[at(0, num_layers_)] = 0;
  for (int g = 1; g <= g_limit; ++g)
    for (int r = min_stages(g); r <= max_stages_for(g); ++r) {
      clear_row(before_, g, r);
      for (int d : widths_)
        if (d <= node_room(g)) relax(g, r, d, 1.0, false, before_, before_);
    }
}

double layout_dp::front_sum(int nodes, int stages) const {
  const int g = nodes * gpus_per_node_;
  if (last_ != last_run::sum || g > max_gpus_ || stages < r_lo_[g] || stages > r_hi_[g] || first_u(g, stages) > 0)
    return kInf;
  const int row_index = row(g, stages);
  return row_index < 0 ? kInf : before_[at(row_index, 0)];
}

double layout_dp::front_sum(int nodes) const {
  const int g = nodes * gpus_per_node_;
  double best = kInf;
  for (int r = min_stages(g); r <= max_stages_for(g); ++r) best = std::min(best, front_sum(nodes, r));
  return best;
}

void layout_dp::clear_row(std::vector<double>& table, int g, int r) {
  const std::size_t base = at(row(g, r), 0);
  const int u_lo = first_u(g, r);
  std::fill(table.begin() + base + u_lo, table.begin() + base + num_layers_ + 1, kInf);
  cells_ += num_layers_ + 1 - u_lo;
}

void layout_dp::compute_full_row(int g, int r) {
  clear_row(after_, g, r);
  clear_row(before_, g, r);
  cells_ -= num_layers_ + 1 - first_u(g, r);  // one count per cell of both tables
  const int room = node_room(g);
  for (int d : widths_)
    if (d <= room) relax(g, r, d, 2.0, true, after_, after_);
  for (int d : widths_)
    if (d <= room) relax_equal(g, r, d, (1 - r) * cap_, after_, before_);
  for (int d : widths_)
    if (d <= room) relax(g, r, d, 1.0, false, before_, before_);
}

int layout_dp::set_hull(const std::vector<std::pair<int, int>>& stage_range) {
  // Row (g, r) lies on a layout of n nodes in S stages only if the S - r stages before it fit on
  // the n M - g GPUs before it: S - r <= n M - g <= M (S - r). A row's transitions read rows of
  // g - d, r - 1, which satisfy the same bounds, so the hull per g is closed under them.
  const int M = gpus_per_node_;
  int n_limit = 0;
  for (int n = 1; n < static_cast<int>(stage_range.size()) && n * M <= max_gpus_; ++n)
    if (stage_range[n].first <= stage_range[n].second) n_limit = n;
  const int g_limit = n_limit * M;
  std::fill(r_lo_.begin(), r_lo_.end(), std::numeric_limits<int>::max());
  std::fill(r_hi_.begin(), r_hi_.end(), -1);
  std::fill(s_min_.begin(), s_min_.end(), std::numeric_limits<int>::max());
  r_lo_[0] = r_hi_[0] = 0;
  for (int n = 1; n <= n_limit; ++n) {
    const auto [lo, hi] = stage_range[n];
    if (lo > hi) continue;
    const int top = n * M;
    for (int g = 1; g <= top; ++g) {
      s_min_[g] = std::min(s_min_[g], lo);
      r_lo_[g] = std::min(r_lo_[g], lo - (top - g));
      r_hi_[g] = std::max(r_hi_[g], hi - (top - g + M - 1) / M);
    }
  }
  for (int g = 1; g <= g_limit; ++g) {
    r_lo_[g] = std::max(r_lo_[g], min_stages(g));
    r_hi_[g] = std::min(r_hi_[g], max_stages_for(g));
  }
  return g_limit;
}

void layout_dp::run_sum(double cap, const std::vector<std::pair<int, int>>& stage_range) {
  set_cap(cap);
  last_ = last_run::sum;
  std::fill(before_.begin(), before_.begin() + (num_layers_ + 1), kInf);
  before_[at(0, num_layers_)] = 0;
  const int g_limit = set_hull(stage_range);
  for (int g = 1; g <= g_limit; ++g)
    for (int r = r_lo_[g]; r <= r_hi_[g]; ++r) {
      clear_row(before_, g, r);
      for (int d : widths_)
        if (d <= node_room(g)) relax(g, r, d, 1.0, false, before_, before_);
    }
}

void layout_dp::run_full(double cap, const std::vector<std::pair<int, int>>& stage_range) {
  set_cap(cap);
  last_ = last_run::full;
  if (after_.empty()) after_.assign(before_.size(), kInf);
  std::fill(after_.begin(), after_.begin() + (num_layers_ + 1), kInf);
  std::fill(before_.begin(), before_.begin() + (num_layers_ + 1), kInf);
  after_[at(0, num_layers_)] = 0;
  const int g_limit = set_hull(stage_range);
  for (int g = 1; g <= g_limit; ++g)
    for (int r = r_lo_[g]; r <= r_hi_[g]; ++r) compute_full_row(g, r);
}

void layout_dp::run_full(double cap, int r_limit, int node_limit) {
  std::vector<std::pair<int, int>> range(node_limit + 1, {1, 0});
  for (int n = 1; n <= node_limit; ++n) range[n] = {1, r_limit};
  run_full(cap, range);
}

double layout_dp::front_full(int nodes, int stages, double cap) const {
  const int g = nodes * gpus_per_node_;
  if (last_ != last_run::full || g > max_gpus_ || stages < r_lo_[g] || stages > r_hi_[g] || first_u(g, stages) > 0)
    return kInf;
  const int row_index = row(g, stages);
  return row_index < 0 ? kInf : before_[at(row_index, 0)] + 4.0 * stages * cap;
}

double layout_dp::front_full(int nodes, double cap, int r_limit, int* stages) const {
  const int g = nodes * gpus_per_node_;
  double best = kInf;
  if (g > max_gpus_) return best;
  for (int r = std::max(1, r_lo_[g]); r <= std::min(r_hi_[g], r_limit); ++r) {
    const double t = front_full(nodes, r, cap);
    if (t < best) {
      best = t;
      if (stages) *stages = r;
    }
  }
  return best;
}

std::vector<stage_spec> layout_dp::trace_sum(int nodes, int stages) const {
  std::vector<stage_spec> out;
  const int total = nodes * gpus_per_node_;
  int u = 0, g = total, r = stages;
  while (r > 0) {
    const double target = before_[at(row(g, r), u)];
    double best = kInf;
    int best_v = -1, best_d = 0;
    for (int d : widths_) {
      if (d > node_room(g) || best == target) continue;
      const int next_row = row(g - d, r - 1);
      if (next_row < 0 || (g - d > 0 && (r - 1 < r_lo_[g - d] || r - 1 > r_hi_[g - d]))) continue;
      const auto& pre = costs_.time_prefix(d);
      const double* next = &before_[at(next_row, 0)];
      const int hi = stage_end_limit(static_cast<std::size_t>(width_index(d)), r, u, false);
      for (int v = u + 1; v <= hi && best != target; ++v) {
        const double value = 1.0 * pre[v] + next[v] - 1.0 * pre[u];
        if (value < best || value == target) {
          best = value;
          best_v = v;
          best_d = d;
        }
      }
    }
    if (best_v < 0 || !(best < kInf)) return {};
    out.push_back({(total - g) / gpus_per_node_, best_d, layer_index{u}, layer_index{best_v},
                   costs_.stage_ms(layer_index{u}, layer_index{best_v}, best_d)});
    u = best_v;
    g -= best_d;
    --r;
  }
  return out;
}

std::vector<stage_spec> layout_dp::trace_full(int nodes, int stages) const {
  // Each step recomputes the candidates of the state's value with the expressions the runs used
  // and follows the one that equals it (the least one if rounding made none equal: its next state
  // is finite, so the walk still ends in a layout within the bounds of its phase).
  std::vector<stage_spec> out;
  const int total = nodes * gpus_per_node_;
  int u = 0, g = total, r = stages;
  bool after = false;
  while (r > 0) {
    const double target = (after ? after_ : before_)[at(row(g, r), u)];
    double best = kInf;
    int best_v = -1, best_d = 0;
    bool best_at = false, exact = false;
    auto consider = [&](double value, int v, int d, bool is_at) {
      if (exact || !(value < best || value == target)) return;
      exact = value == target;
      best = value;
      best_v = v;
      best_d = d;
      best_at = is_at;
    };
    for (int d : widths_) {
      if (d > node_room(g)) continue;
      const int next_row = row(g - d, r - 1);
      if (next_row < 0 || (g - d > 0 && (r - 1 < r_lo_[g - d] || r - 1 > r_hi_[g - d]))) continue;
      const auto& pre = costs_.time_prefix(d);
      const auto i = static_cast<std::size_t>(width_index(d));
      if (after) {
        const double* next = &after_[at(next_row, 0)];
        for (int v = u + 1; v <= stage_end_limit(i, r, u, true); ++v)
          consider(2.0 * pre[v] + next[v] - 2.0 * pre[u], v, d, false);
      } else {
        const double* next_after = &after_[at(next_row, 0)];
        const double* next_before = &before_[at(next_row, 0)];
        const int hi = stage_end_limit(i, r, u, false);
        for (int v = u + 1; v <= hi; ++v) {
          if (pre[v] - pre[u] == cap_) consider(next_after[v] + (1 - r) * cap_, v, d, true);
          consider(1.0 * pre[v] + next_before[v] - 1.0 * pre[u], v, d, false);
        }
      }
    }
    if (best_v < 0) break;  // unreachable after a finite front_full
    const int position = total - g;
    out.push_back({position / gpus_per_node_, best_d, layer_index{u}, layer_index{best_v},
                   costs_.stage_ms(layer_index{u}, layer_index{best_v}, best_d)});
    if (best_at) after = true;
    u = best_v;
    g -= best_d;
    --r;
  }
  return out;
}

}  // namespace oobleck::planning::detail
