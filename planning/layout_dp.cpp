#include "planning/layout_dp.hpp"

#include <algorithm>
#include <limits>

namespace oobleck::planning::detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint8_t kBottleneck = 0xFE;
}  // namespace

layout_dp::layout_dp(const layer_costs& costs, int max_nodes)
    : costs_(costs),
      num_layers_(costs.num_layers()),
      gpus_per_node_(costs.gpus_per_node()),
      max_gpus_(max_nodes * costs.gpus_per_node()),
      max_r_(std::min(costs.num_layers(), max_nodes * costs.gpus_per_node())),
      widths_(stage_widths(costs.gpus_per_node())) {
  // Only (g, r) pairs some layout can reach get a row: r in [ceil(g/M), min(g, L)].
  row_.assign(static_cast<std::size_t>(max_gpus_ + 1) * (max_r_ + 1), -1);
  row_[0] = rows_++;
  rows_through_.assign(max_gpus_ + 1, rows_);
  for (int g = 1; g <= max_gpus_; ++g) {
    for (int r = min_stages(g); r <= std::min(max_stages_for(g), max_r_); ++r) row_[g * (max_r_ + 1) + r] = rows_++;
    rows_through_[g] = rows_;
  }
  const std::size_t cells = static_cast<std::size_t>(rows_) * (num_layers_ + 1);
  for (table* t : {&after_, &at_, &before_}) {
    t->value.assign(cells, kInf);
    t->next_layer.assign(cells, 0);
    t->width_tag.assign(cells, 0);
  }
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

void layout_dp::reset(table& t, int g_limit) {
  std::fill(t.value.begin(), t.value.begin() + at(rows_through_[g_limit], layer_index{0}), kInf);
}

// out[u] = min(out[u], min_{v in window(u)} coef * w(u, v, d) + next[v] + add) for the stage [u, v)
// on d GPUs with r stages remaining. window(u) = [u + 1, hi(u)], where hi(u) is the largest v whose
// stage passes the cap and the memory check and leaves >= r - 1 layers; hi is non-increasing as u
// decreases, so a monotone deque gives every window minimum in O(1) amortised.
void layout_dp::relax(int g, int r, int d, double coef, double add, rule how, double cap, const table& next,
                      table& out) {
  const int next_row = row(g - d, r - 1);
  if (next_row < 0) return;
  const int out_row = row(g, r);
  const auto& pre = costs_.time_prefix(d);
  const double* next_value = &next.value[at(next_row, layer_index{0})];
  double* out_value = &out.value[at(out_row, layer_index{0})];
  std::uint16_t* out_next = &out.next_layer[at(out_row, layer_index{0})];
  std::uint8_t* out_tag = &out.width_tag[at(out_row, layer_index{0})];
  const auto tag = static_cast<std::uint8_t>(width_index(d));
  const int last_v = num_layers_ - (r - 1);
  const int L = num_layers_;
  const std::uint16_t* memory_hi = &memory_hi_[(tag * (max_r_ + 1) + r) * L];
  const std::uint16_t* cap_hi = &(how == rule::below ? cap_below_ : cap_at_most_)[tag * L];
  int front = num_layers_ + 1, back = num_layers_ + 1;  // deque window_[front, back), newest at front
  for (int u = last_v - 1; u >= 0; --u) {
    const int hi = std::min<int>({memory_hi[u], cap_hi[u], last_v});
    if (how == rule::equal) {
      for (int v = hi; v > u && pre[v] - pre[u] == cap; --v) {
        const double candidate = next_value[v] + add;
        if (candidate < out_value[u]) {
          out_value[u] = candidate;
          out_next[u] = static_cast<std::uint16_t>(v);
          out_tag[u] = tag;
        }
      }
      continue;
    }
    // v = u + 1 enters the window (if the window reaches it); entries beyond hi leave.
    if (u + 1 <= hi) {
      const double base = coef * pre[u + 1] + next_value[u + 1];
      while (front < back && window_[front].value >= base) ++front;
      window_[--front] = {u + 1, base};
    }
    while (front < back && window_[back - 1].v > hi) --back;
    if (front == back) continue;
    const double candidate = window_[back - 1].value - coef * pre[u] + add;
    if (candidate < out_value[u]) {
      out_value[u] = candidate;
      out_next[u] = static_cast<std::uint16_t>(window_[back - 1].v);
      out_tag[u] = tag;
    }
  }
}

void layout_dp::run_sum(double cap, int node_limit) {
  set_cap(cap);
  const int g_limit = std::min(max_gpus_, node_limit * gpus_per_node_);
  reset(before_, g_limit);
  before_.value[at(row(0, 0), layer_index{num_layers_})] = 0;
  for (int g = 1; g <= g_limit; ++g)
    for (int r = min_stages(g); r <= std::min(max_stages_for(g), max_r_); ++r)
      for (int d : widths_)
        if (d <= node_room(g)) relax(g, r, d, 1.0, 0.0, rule::at_most, cap, before_, before_);
}

double layout_dp::front_sum(int nodes, int stages) const {
  const int g = nodes * gpus_per_node_;
  const int row_index = row(g, stages);
  return row_index < 0 ? kInf : before_.value[at(row_index, layer_index{0})];
}

double layout_dp::front_sum(int nodes) const {
  const int g = nodes * gpus_per_node_;
  double best = kInf;
  for (int r = min_stages(g); r <= std::min(max_stages_for(g), max_r_); ++r)
    best = std::min(best, before_.value[at(row(g, r), layer_index{0})]);
  return best;
}

void layout_dp::run_full(double cap, int r_limit, int node_limit) {
  set_cap(cap);
  const int g_limit = std::min(max_gpus_, node_limit * gpus_per_node_);
  reset(after_, g_limit);
  reset(at_, g_limit);
  reset(before_, g_limit);
  after_.value[at(row(0, 0), layer_index{num_layers_})] = 0;
  for (int g = 1; g <= g_limit; ++g) {
    const int r_hi = std::min({max_stages_for(g), max_r_, r_limit});
    for (int r = min_stages(g); r <= r_hi; ++r) {
      const int room = node_room(g);
      for (int d : widths_)
        if (d <= room) relax(g, r, d, 2.0, 0.0, rule::below, cap, after_, after_);
      for (int d : widths_)
        if (d <= room) relax(g, r, d, 0.0, (1 - r) * cap, rule::equal, cap, after_, at_);
      const std::size_t base = at(row(g, r), layer_index{0});
      for (int u = 0; u <= num_layers_; ++u) {
        before_.value[base + u] = at_.value[base + u];
        before_.width_tag[base + u] = kBottleneck;
      }
      for (int d : widths_)
        if (d <= room) relax(g, r, d, 1.0, 0.0, rule::at_most, cap, before_, before_);
    }
  }
}

double layout_dp::front_full(int nodes, double cap, int r_limit, int* stages) const {
  const int g = nodes * gpus_per_node_;
  double best = kInf;
  const int r_hi = std::min({max_stages_for(g), max_r_, r_limit});
  for (int r = min_stages(g); r <= r_hi; ++r) {
    const double t = before_.value[at(row(g, r), layer_index{0})] + 4.0 * r * cap;
    if (t < best) {
      best = t;
      if (stages) *stages = r;
    }
  }
  return best;
}

std::vector<stage_spec> layout_dp::trace_full(int nodes, int stages) const {
  std::vector<stage_spec> out;
  const int total = nodes * gpus_per_node_;
  int u = 0, g = total, r = stages;
  const table* phase = &before_;
  while (r > 0) {
    const std::size_t i = at(row(g, r), layer_index{u});
    if (phase == &before_ && before_.width_tag[i] == kBottleneck) {
      phase = &at_;
      continue;
    }
    const int v = phase->next_layer[i];
    const int d = 1 << phase->width_tag[i];
    const int position = total - g;
    out.push_back({position / gpus_per_node_, d, layer_index{u}, layer_index{v}, costs_.stage_ms(layer_index{u}, layer_index{v}, d)});
    if (phase == &at_) phase = &after_;
    u = v;
    g -= d;
    --r;
  }
  return out;
}

}  // namespace oobleck::planning::detail
