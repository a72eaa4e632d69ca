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

linear_time pipeline_template::time_line() const { return iteration_time_line(stage_ms()); }

std::pair<int, int> pipeline_template::node_layers(int node) const {
  int first = -1, end = -1;
  for (const auto& s : stages) {
    if (s.node != node) continue;
    if (first < 0) first = s.first_layer;
    end = s.end_layer;
  }
  if (first < 0) return {0, 0};
  return {first, end};
}

std::optional<pipeline_template> template_generator::generate(int nodes) {
  return generate(nodes, nodes).front();
}

std::vector<bool> template_generator::feasible_node_counts(int hi) {
  stats_ = {};
  std::vector<bool> feasible(hi + 1, false);
  if (hi < 1) return feasible;
  detail::layout_dp dp(costs_, hi);
  dp.run_sum(kInf);
  ++stats_.feasibility_runs;
  for (int n = 1; n <= hi; ++n) feasible[n] = std::isfinite(dp.front_sum(n));
  return feasible;
}

std::vector<std::optional<pipeline_template>> template_generator::generate(int lo, int hi) {
  stats_ = {};
  if (lo < 1 || hi < lo) throw planning_error("template node range [" + std::to_string(lo) + ", " +
                                              std::to_string(hi) + "] is empty or starts below 1");
  const int count = hi - lo + 1;
  std::vector<std::optional<pipeline_template>> result(count);
  detail::layout_dp dp(costs_, hi);
  const int L = costs_.num_layers();

  // W_min(n): the least total work of any feasible layout; also tells which n are feasible.
  dp.run_sum(kInf);
  ++stats_.feasibility_runs;
  std::vector<double> min_work(count);
  std::vector<bool> feasible(count);
  bool any = false;
  for (int i = 0; i < count; ++i) {
    min_work[i] = dp.front_sum(lo + i);
    feasible[i] = std::isfinite(min_work[i]);
    any = any || feasible[i];
  }
  if (!any) return result;

  // Every stage latency that can occur in a feasible layout is a possible bottleneck value.
  std::vector<double> caps;
  for (int d : stage_widths(costs_.gpus_per_node()))
    for (int u = 0; u < L; ++u)
      for (int v = u + 1; v <= L && costs_.stage_fits(u, v, d, 1); ++v) caps.push_back(costs_.stage_ms(u, v, d));
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  stats_.candidate_caps = static_cast<int>(caps.size());

  // Smallest cap under which some requested n has a layout (feasibility is monotone in the cap).
  auto some_feasible = [&](double cap) {
    dp.run_sum(cap);
    ++stats_.feasibility_runs;
    for (int i = 0; i < count; ++i)
      if (feasible[i] && std::isfinite(dp.front_sum(lo + i))) return true;
    return false;
  };
  std::size_t first = 0, last = caps.size() - 1;
  while (first < last) {
    const std::size_t mid = (first + last) / 2;
    if (some_feasible(caps[mid])) last = mid;
    else first = mid + 1;
  }

  std::vector<double> best(count, kInf), best_cap(count, kInf);
  for (std::size_t c = first; c < caps.size(); ++c) {
    const double cap = caps[c];
    // Any layout of n nodes with bottleneck `cap` has T >= W_min(n) + 3 S cap with S >= n.
    int r_limit = 0;
    for (int i = 0; i < count; ++i) {
      if (!feasible[i] || min_work[i] + 3.0 * (lo + i) * cap >= best[i]) continue;
      const double s_hi = std::isfinite(best[i]) ? std::floor((best[i] - min_work[i]) / (3.0 * cap)) : kInf;
      r_limit = std::max(r_limit, static_cast<int>(std::min<double>(s_hi, dp.max_stages())));
    }
    if (r_limit == 0) break;
    dp.run_full(cap, r_limit);
    ++stats_.caps_evaluated;
    for (int i = 0; i < count; ++i) {
      if (!feasible[i]) continue;
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
    dp.run_full(cap, dp.max_stages());
    for (int i : members) {
      int stages = 0;
      dp.front_full(lo + i, cap, dp.max_stages(), &stages);
      pipeline_template t;
      t.nodes = lo + i;
      t.stages = dp.trace_full(lo + i, stages);
      t.iteration_ms = ranking_time(t.stage_ms());
      result[i] = std::move(t);
    }
  }
  return result;
}

}  // namespace oobleck::planning
