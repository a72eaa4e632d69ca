#include "planning/pipeline_template.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <map>
#include <string>

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

namespace {

/// "1.53 GiB", or "8.0 MiB" below a tenth of a GiB.
std::string size_text(std::uint64_t bytes) {
  char text[48];
  const double gib = static_cast<double>(bytes) / (1ull << 30);
  if (gib >= 0.1) std::snprintf(text, sizeof text, "%.2f GiB", gib);
  else std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  return text;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

}  // namespace

std::uint64_t planning_memory_bytes(const layer_costs& costs, int hi) {
  const double L = costs.num_layers();
  const double widths = static_cast<double>(stage_widths(costs.gpus_per_node()).size());
  const double max_s = std::min(L, static_cast<double>(hi) * costs.gpus_per_node());
  // Candidate bottleneck values (at most one per stage [u, v) and width) and W_min(n, S).
  const double extra = widths * L * (L + 1) / 2 * sizeof(double) + hi * (max_s + 1) * sizeof(double);
  return saturating_add(detail::layout_dp::bytes_needed(costs, hi), static_cast<std::uint64_t>(extra));
}

void template_generator::check_memory(std::uint64_t bytes, int hi) {
  stats_.memory_bytes = bytes;
  if (options_.memory_limit_bytes == 0 || bytes <= options_.memory_limit_bytes) return;
  throw planning_error("this profile needs ~" + size_text(bytes) + " to plan templates of up to " + std::to_string(hi) +
                       " nodes (" + std::to_string(costs_.num_layers()) + " layers, " +
                       std::to_string(costs_.gpus_per_node()) + " GPUs per node; the tables grow as node count x GPUs " +
                       "x layers); the planning memory limit is " + size_text(options_.memory_limit_bytes) +
                       ": raise it (oobleck-plan --plan-memory-limit) or plan fewer nodes");
}

std::vector<bool> template_generator::feasible_node_counts(int hi) {
  stats_ = {};
  std::vector<bool> feasible(hi + 1, false);
  if (hi < 1) return feasible;
  check_memory(detail::layout_dp::bytes_needed(costs_, hi, false), hi);
  detail::layout_dp dp(costs_, hi);
  dp.run_sum(kInf, hi);
  ++stats_.feasibility_runs;
  for (int n = 1; n <= hi; ++n) feasible[n] = std::isfinite(dp.front_sum(n));
  stats_.dp_cells = dp.cells_computed();
  return feasible;
}

namespace {

/// Every stage latency that can occur in a feasible layout: the possible bottleneck values.
std::vector<double> candidate_caps(const layer_costs& costs) {
  std::vector<double> caps;
  const int L = costs.num_layers();
  // At most one per stage and width, as planning_memory_bytes counts (no reallocation past it).
  caps.reserve(stage_widths(costs.gpus_per_node()).size() * static_cast<std::size_t>(L) * (L + 1) / 2);
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
  check_memory(planning_memory_bytes(costs_, hi), hi);
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
  if (std::none_of(feasible.begin(), feasible.end(), [](bool f) { return f; })) {
    stats_.dp_cells = dp.cells_computed();
    return result;
  }

  const std::vector<double> caps = candidate_caps(costs_);
  stats_.candidate_caps = static_cast<int>(caps.size());

  // first_cap[i]: no cap below it is feasible for lo + i. A layout of S stages has a stage >=
  // W_min(n, S) / S; the blocks below find which pairs are feasible at all.
  std::vector<std::size_t> first_cap(count, caps.size());
  for (int i = 0; i < count; ++i) {
    if (!feasible[i]) continue;
    double floor_cap = kInf;
    for (int s = 1; s <= max_s; ++s) floor_cap = std::min(floor_cap, min_work[i][s] / s);
    first_cap[i] = std::lower_bound(caps.begin(), caps.end(), floor_cap * (1 - 1e-12)) - caps.begin();
  }

  // Stage count S of n nodes can still give a better T at cap c only inside the window
  // W_min(n, S) / S <= c (every stage is <= c) and 2 W_min(n, S) + (3S - 1) c < best(n).
  // The second bound: with P the work before the bottleneck and Q after it,
  // T = P + (3S + k* + 1) c + 2Q and P <= k* c, so T >= 2 (P + c + Q) + (3S - 1) c.
  auto bound = [&](int i, int s, double cap) {
    const double w = min_work[i][s];
    return 2.0 * w + (3.0 * s - 1.0) * std::max(cap, w / s * (1 - 1e-12));
  };
  std::vector<double> best(count, kInf), best_cap(count, kInf);
  std::vector<int> best_stages(count, 0);
  std::vector<std::vector<stage_spec>> found(count);  // the best layout where a trace found it
  std::vector<std::pair<int, int>> range(hi + 1);

  // Seeds: an answer for each n before the search, so that its bound prunes from the first cap.
  // The stage count S with the least bound at its floor is the likely optimum's; the smallest
  // cap at which (n, S) is feasible (bisected on that pair's rows alone, which for S near n are
  // about one per GPU) has a layout with exactly that bottleneck (the min-max layout), whose T
  // the full DP gives. Any layout is an upper bound; the search proves or improves it.
  for (int i = 0; i < count; ++i) {
    if (!feasible[i]) continue;
    int guess = 0;
    double guess_bound = kInf;
    for (int s = 1; s <= max_s; ++s)
      if (std::isfinite(min_work[i][s]) && bound(i, s, 0) < guess_bound) {
        guess_bound = bound(i, s, 0);
        guess = s;
      }
    if (guess == 0) continue;
    std::fill(range.begin(), range.end(), std::pair{1, 0});
    range[lo + i] = {guess, guess};
    auto pair_feasible = [&](std::size_t c) {
      dp.run_sum(caps[c], range);
      ++stats_.feasibility_runs;
      return std::isfinite(dp.front_sum(lo + i, guess));
    };
    std::size_t low = std::lower_bound(caps.begin(), caps.end(), min_work[i][guess] / guess * (1 - 1e-12)) - caps.begin();
    low = std::max(low, first_cap[i]);
    std::size_t high = caps.size() - 1;
    if (!pair_feasible(high)) continue;
    for (std::size_t step = 1; low < high; step *= 2) {
      const std::size_t probe = std::min(low + step - 1, high);
      if (pair_feasible(probe)) {
        high = probe;
        break;
      }
      low = probe + 1;
    }
    while (low < high) {
      const std::size_t mid = (low + high) / 2;
      if (pair_feasible(mid)) high = mid;
      else low = mid + 1;
    }
    dp.run_full(caps[high], range);
    ++stats_.caps_evaluated;
    const double t = dp.front_full(lo + i, guess, caps[high]);
    if (t < best[i]) {
      best[i] = t;
      best_cap[i] = caps[high];
      best_stages[i] = guess;
    }
  }

  const std::uint64_t search_start = dp.cells_computed();
  // searched_to[i]: the first cap no longer searched for lo + i because of the work limit.
  std::vector<std::size_t> searched_to(count, caps.size());
  // Pair bounds of the current block of caps (see below), valid for caps up to block_end.
  constexpr std::size_t kBlock = 16;
  std::vector<std::vector<double>> block_work(count, std::vector<double>(max_s + 1, kInf));
  std::size_t block_end = 0;
  bool block_open = false;
  for (std::size_t c = *std::min_element(first_cap.begin(), first_cap.end()); c < caps.size(); ++c) {
    const double cap = caps[c];
    // Past the work limit only node counts without an answer are searched (at their first cap).
    const bool over = options_.work_limit_cells != 0 && dp.cells_computed() - search_start > options_.work_limit_cells;
    int active_count = 0;
    bool ahead = false;
    std::fill(range.begin(), range.end(), std::pair{1, 0});
    for (int i = 0; i < count; ++i) {
      if (!feasible[i]) continue;
      if (over && std::isfinite(best[i])) {
        searched_to[i] = std::min(searched_to[i], c);
        continue;
      }
      if (c < first_cap[i]) {
        ahead = true;
        continue;
      }
      int s_lo = max_s + 1, s_hi = 0;
      for (int s = 1; s <= max_s; ++s) {
        const double w = min_work[i][s];
        if (!std::isfinite(w)) continue;
        if (cap < w / s * (1 - 1e-12)) {
          ahead = ahead || bound(i, s, cap) < best[i];
        } else if (bound(i, s, cap) < best[i]) {
          s_lo = std::min(s_lo, s);
          s_hi = s;
        }
      }
      if (s_lo <= s_hi) {
        range[lo + i] = {s_lo, s_hi};
        ++active_count;
      }
    }
    if (active_count == 0) {
      if (ahead) continue;
      break;
    }
    // The least work of each pair with every stage <= the block's last cap (inf: no such layout)
    // bounds the pair at every cap of the block: W >= that, and a pair infeasible there stays
    // infeasible below. A pair it rules out is not computed by the full run.
    if (!block_open || c > block_end) {
      block_open = true;
      block_end = std::min(caps.size() - 1, c + kBlock - 1);
      std::vector<std::pair<int, int>> block_range(hi + 1, {1, 0});
      for (int i = 0; i < count; ++i) {
        if (!feasible[i] || block_end < first_cap[i] || (over && std::isfinite(best[i]))) continue;
        int s_lo = max_s + 1, s_hi = 0;
        for (int s = 1; s <= max_s; ++s)
          if (std::isfinite(min_work[i][s]) && bound(i, s, cap) < best[i] &&
              !(caps[block_end] < min_work[i][s] / s * (1 - 1e-12))) {
            s_lo = std::min(s_lo, s);
            s_hi = s;
          }
        block_range[lo + i] = {s_lo, s_hi};
      }
      dp.run_sum(caps[block_end], block_range);
      ++stats_.feasibility_runs;
      for (int i = 0; i < count; ++i) {
        int guess = 0;
        double guess_bound = kInf;
        for (int s = 1; s <= max_s; ++s) {
          block_work[i][s] = dp.front_sum(lo + i, s);
          const double b = 2.0 * block_work[i][s] + (3.0 * s - 1.0) * caps[block_end];
          if (b < guess_bound) {
            guess_bound = b;
            guess = s;
          }
        }
        // An upper bound early: the least-work layout of the most promising stage count under
        // this block's largest cap is a layout; its T prunes every pair whose bound is above it.
        // It is the answer when no bottleneck value gives less.
        if (guess == 0 || !(guess_bound < best[i])) continue;
        auto stages = dp.trace_sum(lo + i, guess);
        if (stages.empty()) continue;
        std::vector<double> w;
        for (const auto& st : stages) w.push_back(st.ms);
        const double t = ranking_time(w);
        if (t < best[i]) {
          best[i] = t;
          best_cap[i] = kInf;
          best_stages[i] = static_cast<int>(stages.size());
          found[i] = std::move(stages);
        }
      }
    }
    active_count = 0;
    for (int i = 0; i < count; ++i) {
      auto& [s_lo, s_hi] = range[lo + i];
      int new_lo = max_s + 1, new_hi = 0;
      for (int s = s_lo; s <= s_hi; ++s) {
        const double w = block_work[i][s];
        if (std::isfinite(w) && 2.0 * w + (3.0 * s - 1.0) * cap < best[i]) {
          new_lo = std::min(new_lo, s);
          new_hi = s;
        }
      }
      s_lo = new_lo;
      s_hi = new_hi;
      if (s_lo <= s_hi) ++active_count;
    }
    if (active_count == 0) continue;
    dp.run_full(cap, range);
    ++stats_.caps_evaluated;
    for (int i = 0; i < count; ++i) {
      const auto [s_lo, s_hi] = range[lo + i];
      if (s_lo > s_hi) continue;
      int stages = 0;
      const double t = dp.front_full(lo + i, cap, s_hi, &stages);
      if (t < best[i]) {
        best[i] = t;
        best_cap[i] = cap;
        best_stages[i] = stages;
        found[i].clear();
      }
    }
  }
  // A layout the search skipped below searched_to could not beat the answer (its bound did not);
  // one it did not reach has a bottleneck >= caps[searched_to]: bound it from there.
  std::vector<double> lower(best);
  for (int i = 0; i < count; ++i)
    if (searched_to[i] < caps.size())
      for (int s = 1; s <= max_s; ++s)
        if (std::isfinite(min_work[i][s])) lower[i] = std::min(lower[i], bound(i, s, caps[searched_to[i]]));

  // Rebuild each optimum; node counts that share a bottleneck value share one DP run.
  std::map<double, std::vector<int>> by_cap;
  for (int i = 0; i < count; ++i)
    if (std::isfinite(best[i])) by_cap[best_cap[i]].push_back(i);
  for (const auto& [cap, members] : by_cap) {
    std::fill(range.begin(), range.end(), std::pair{1, 0});
    for (int i : members) range[lo + i] = {best_stages[i], best_stages[i]};
    if (std::isfinite(cap)) dp.run_full(cap, range);
    for (int i : members) {
      pipeline_template t;
      t.nodes = lo + i;
      t.stages = std::isfinite(cap) ? dp.trace_full(lo + i, best_stages[i]) : std::move(found[i]);
      for (auto& s : t.stages) {
        s.forward_ms = costs_.forward_ms(s.first_layer, s.end_layer, s.gpus);
        s.backward_ms = costs_.backward_ms(s.first_layer, s.end_layer, s.gpus);
      }
      t.iteration_ms = ranking_time(t.stage_ms());
      t.time = predicted_time(costs_, t.stages);
      t.exact = !(lower[i] < best[i]);
      t.lower_bound_ms = t.exact ? t.iteration_ms : lower[i];
      if (!t.exact) ++stats_.inexact_templates;
      result[i] = std::move(t);
    }
  }
  stats_.dp_cells = dp.cells_computed();
  return result;
}

}  // namespace oobleck::planning
