#include "planning/pipeline_template.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "planning/layout_dp.hpp"

namespace oobleck::planning {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

std::vector<double> pipeline_template::stage_ms() const {
  std::vector<double> w;
  w.reserve(stages.size());
  for (const auto& s : stages) w.push_back(s.ms);
  return w;
}


pipeline_time predicted_time(const layer_costs& costs, const std::vector<stage_spec>& stages) {
  std::vector<double> forward, backward;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const auto& s = stages[k];
    double f = s.forward_ms, b = s.backward_ms;
    if (k > 0 && stages[k - 1].node != s.node) f += costs.link().message_ms(costs.output_bytes(layer_index{s.first_layer.value - 1}));
    if (k + 1 < stages.size() && stages[k + 1].node != s.node) b += costs.link().message_ms(costs.output_bytes(layer_index{s.end_layer.value - 1}));
    forward.push_back(f);
    backward.push_back(b);
  }
  return pipeline_time::one_f_one_b(forward, backward);
}

std::pair<layer_index, layer_index> pipeline_template::node_layers(int position) const {
  std::optional<layer_index> first;
  layer_index end;
  for (const auto& s : stages) {
    if (s.node != position) continue;
    if (!first) first = s.first_layer;
    end = s.end_layer;
  }
  if (!first) return {};
  return {*first, end};
}

std::optional<pipeline_template> template_generator::generate(int nodes) {
  return generate(nodes, nodes).front();
}

std::vector<bool> template_generator::feasible_node_counts(int hi) {
  stats_ = {};
  std::vector<bool> feasible(hi + 1, false);
  if (hi < 1) return feasible;
  detail::layout_dp dp(costs_, hi);
  dp.run_sum(kInf, hi);
  ++stats_.feasibility_runs;
  for (int n = 1; n <= hi; ++n) feasible[n] = std::isfinite(dp.front_sum(n));
  return feasible;
}

namespace {

/// Every stage latency that can occur in a feasible layout: the possible bottleneck values.
std::vector<double> candidate_caps(const layer_costs& costs) {
  std::vector<double> caps;
  const int L = costs.num_layers();
  for (int d : stage_widths(costs.gpus_per_node()))
    for (int u = 0; u < L; ++u)
      for (int v = u + 1; v <= L && costs.stage_fits(layer_index{u}, layer_index{v}, d, 1); ++v)
        caps.push_back(costs.stage_ms(layer_index{u}, layer_index{v}, d));
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  return caps;
}

}  // namespace

std::vector<std::optional<pipeline_template>> template_generator::generate(int lo, int hi) {
  stats_ = {};
  if (lo < 1 || hi < lo) throw planning_error("template node range [" + std::to_string(lo) + ", " +
                                              std::to_string(hi) + "] is empty or starts below 1");
  const int count = hi - lo + 1;
  std::vector<std::optional<pipeline_template>> result(count);
  detail::layout_dp dp(costs_, hi);

  // W_min(n, S): the least total work of any feasible layout of n nodes in S stages.
  dp.run_sum(kInf, hi);
  ++stats_.feasibility_runs;
  const int max_s = dp.max_stages();
  std::vector<std::vector<double>> min_work(count, std::vector<double>(max_s + 1, kInf));
  std::vector<bool> feasible(count);
  for (int i = 0; i < count; ++i) {
    for (int s = 1; s <= max_s; ++s) min_work[i][s] = dp.front_sum(lo + i, s);
    feasible[i] = std::isfinite(dp.front_sum(lo + i));
  }
  if (std::none_of(feasible.begin(), feasible.end(), [](bool f) { return f; })) return result;

  const std::vector<double> caps = candidate_caps(costs_);
  stats_.candidate_caps = static_cast<int>(caps.size());

  // The smallest feasible cap of each n (feasibility is monotone in the cap). A layout of S stages
  // has a stage >= W_min(n, S) / S, so the search gallops up from that floor, or from the answer
  // for n + 1 (more nodes rarely need a larger bottleneck) once the cap just below that answer is
  // known to be infeasible for n; then it bisects.
  auto feasible_at = [&](int i, std::size_t c) {
    dp.run_sum(caps[c], lo + i);
    ++stats_.feasibility_runs;
    return std::isfinite(dp.front_sum(lo + i));
  };
  std::vector<std::size_t> first_cap(count, caps.size());
  std::size_t hint = 0;
  for (int i = count - 1; i >= 0; --i) {
    if (!feasible[i]) continue;
    double floor_cap = kInf;
    for (int s = 1; s <= max_s; ++s) floor_cap = std::min(floor_cap, min_work[i][s] / s);
    std::size_t low = std::lower_bound(caps.begin(), caps.end(), floor_cap * (1 - 1e-12)) - caps.begin();
    if (hint > low && !feasible_at(i, hint - 1)) low = hint;
    std::size_t high = caps.size() - 1;  // the largest cap admits every feasible layout
    for (std::size_t step = 1; low < high; step *= 2) {
      const std::size_t probe = std::min(low + step - 1, high);
      if (feasible_at(i, probe)) {
        high = probe;
        break;
      }
      low = probe + 1;
    }
    while (low < high) {
      const std::size_t mid = (low + high) / 2;
      if (feasible_at(i, mid)) high = mid;
      else low = mid + 1;
    }
    first_cap[i] = hint = high;
  }

  std::vector<double> best(count, kInf), best_cap(count, kInf);
  for (std::size_t c = *std::min_element(first_cap.begin(), first_cap.end()); c < caps.size(); ++c) {
    const double cap = caps[c];
    // Stage count S of n nodes can still give a better T at this cap only inside the window
    // W_min(n, S) / S <= cap (every stage is <= cap) and 2 W_min(n, S) + (3S - 1) cap < best(n).
    // The second bound: with P the work before the bottleneck and Q after it,
    // T = P + (3S + k* + 1) cap + 2Q and P <= k* cap, so T >= 2 (P + cap + Q) + (3S - 1) cap.
    // Once no window is open and no n is still below its first feasible cap, the search is over.
    int r_limit = 0, node_limit = 0;
    bool ahead = false;
    std::vector<bool> active(count, false);
    for (int i = 0; i < count; ++i) {
      if (!feasible[i]) continue;
      if (c < first_cap[i]) {
        ahead = true;
        continue;
      }
      for (int s = max_s; s >= 1; --s) {
        const double w = min_work[i][s];
        if (!std::isfinite(w)) continue;
        const double floor_s = w / s * (1 - 1e-12);
        if (cap < floor_s) {
          ahead = ahead || 2.0 * w + (3.0 * s - 1.0) * floor_s < best[i];
        } else if (2.0 * w + (3.0 * s - 1.0) * cap < best[i]) {
          r_limit = std::max(r_limit, s);
          node_limit = lo + i;
          active[i] = true;
        }
      }
    }
    if (r_limit == 0) {
      if (ahead) continue;
      break;
    }
    // Large node counts settle first; the DP stops at the GPUs of the largest still active.
    dp.run_full(cap, r_limit, node_limit);
    ++stats_.caps_evaluated;
    for (int i = 0; i < count; ++i) {
      if (!active[i]) continue;
      const double t = dp.front_full(lo + i, cap, r_limit);
      if (t < best[i]) {
        best[i] = t;
        best_cap[i] = cap;
      }
    }
  }

  // Rebuild each optimum; node counts that share a bottleneck value share one DP run.
  std::map<double, std::vector<int>> by_cap;
  for (int i = 0; i < count; ++i)
    if (std::isfinite(best[i])) by_cap[best_cap[i]].push_back(i);
  for (const auto& [cap, members] : by_cap) {
    dp.run_full(cap, dp.max_stages(), lo + members.back());
    for (int i : members) {
      int stages = 0;
      dp.front_full(lo + i, cap, dp.max_stages(), &stages);
      pipeline_template t;
      t.nodes = lo + i;
      t.stages = dp.trace_full(lo + i, stages);
      for (auto& s : t.stages) {
        s.forward_ms = costs_.forward_ms(s.first_layer, s.end_layer, s.gpus);
        s.backward_ms = costs_.backward_ms(s.first_layer, s.end_layer, s.gpus);
      }
      t.iteration_ms = ranking_time(t.stage_ms());
      t.time = predicted_time(costs_, t.stages);
      result[i] = std::move(t);
    }
  }
  return result;
}

}  // namespace oobleck::planning
