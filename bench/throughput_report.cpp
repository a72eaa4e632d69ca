// bench/throughput's report (throughput_report.hpp): the table of every configuration, the figures
// of each run, where each configuration's efficiency goes, and the JSON.
#include "bench/throughput_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/cluster_programs.hpp"
#include "bench/recovery_stats.hpp"

namespace oobleck::bench::throughput {

namespace fs = std::filesystem;

namespace {

/// A figure for the JSON: null where it could not be measured (NAN).
nlohmann::ordered_json number_or_null(double x) { return std::isnan(x) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(x); }

/// The scaling efficiency the 1F1B bubble alone allows: every pipeline's layers split evenly over
/// its p nodes at the single process's speed, so its step lasts (m + p - 1) / p of one process's
/// microbatch time for its m microbatches, and the slowest pipeline sets the step; no all-reduce,
/// AdamW or messages. M / (nodes × max (m + p - 1) / p) for the job's M microbatches: 8/9 for one
/// pipeline of 2 nodes with 8 (the "bubble cap").
double bubble_cap(const std::vector<std::pair<std::size_t, int>>& pipelines, int nodes_in_use) {
  int total = 0;
  double slowest = 0;
  for (const auto& [nodes, microbatches] : pipelines) {
    total += microbatches;
    slowest = std::max(slowest, (microbatches + static_cast<double>(nodes) - 1) / static_cast<double>(nodes));
  }
  return slowest > 0 ? total / (nodes_in_use * slowest) : NAN;
}

}  // namespace

void report(const options& o, const std::vector<configuration>& configurations, const rounds& measured) {
  const auto& single_ms = measured.single_ms;
  const double single_median = bench::median(single_ms);
  const int microbatches = measured.global_batch / measured.microbatch;

  std::printf("throughput of oobleck-local: B = %d, b = %d, %d layers; %d steps per run, first %d left out; %d round(s)%s\n",
              measured.global_batch, measured.microbatch, measured.layers, o.steps, o.warmup, o.runs,
              o.profile_at_start ? "; profiled by the coordinator at each run's start" : "");
  std::printf("profile (oobleck-profile, here): one microbatch through every layer %.3f ms; x %d microbatches = %.2f ms\n",
              measured.profile_microbatch_ms, microbatches, measured.profile_microbatch_ms * microbatches);
  std::printf("single process: %.2f ms per step (median of %d), %.1f samples/s; malloc from %s\n", single_median,
              o.runs, 1000.0 * measured.global_batch / single_median, bench::allocator_in_use().c_str());
  nlohmann::ordered_json side_json = nlohmann::ordered_json::object();
  for (const auto& [n, per_round] : measured.side_ms) {
    std::vector<double> ratio;
    for (std::size_t i = 0; i < per_round.size(); ++i) ratio.push_back(per_round[i] / single_ms.at(i));
    std::printf("single process, %d copies side by side: %.2f ms per step each (%.3fx alone)\n", n,
                bench::median(per_round), bench::median(ratio));
    side_json[std::to_string(n)] = {{"step_ms", bench::median(per_round)},
                                    {"step_ms_per_round", per_round},
                                    {"over_alone", bench::median(ratio)}};
  }
  std::printf("\n");
  std::printf("%5s %7s %9s %9s %9s %7s %9s %7s %7s | %8s %8s %8s %8s %8s %8s | %9s %9s %8s\n", "nodes", "overlap",
              "pipelines", "pred ms", "step ms", "/pred", "samples/s", "effic.", "eff.sbs", "compute", "p2p", "allred",
              "optim",
              "control", "other", "pred comp", "ideal ms", "overhd");
  nlohmann::ordered_json rows = nlohmann::json::array();
  struct budget {
    int nodes;
    bool overlap;
    double cap, at_ideal, measured;
  };
  std::vector<budget> budgets;  ///< where each configuration's efficiency goes
  for (const auto& c : configurations) {
    auto each = [&](auto figure) {
      std::vector<double> v;
      for (const auto& r : c.runs) v.push_back(figure(r));
      return v;
    };
    const auto step = each([](const run_result& r) { return r.step_ms; });
    const auto pred = each([](const run_result& r) { return r.predicted_ms; });
    const auto ratio = each([](const run_result& r) { return r.step_ms / r.predicted_ms; });
    const auto sps = each([](const run_result& r) { return r.samples_per_s; });
    const auto ideal = each([](const run_result& r) { return r.ideal_ms; });
    const auto overhead = each([](const run_result& r) { return r.step_ms / r.ideal_ms - 1; });
    // The control messages on the step's critical path: a step sent with the previous commit
    // (run-ahead) counts its parts from its orders, ahead_ms before its wall time starts.
    const auto control =
        each([](const run_result& r) { return r.breakdown.at("control_ms") - r.breakdown.at("ahead_ms"); });
    std::map<std::string, double> breakdown;
    for (const auto& [key, value] : c.runs.front().breakdown)
      breakdown[key] = bench::median(each([&key = key](const run_result& r) { return r.breakdown.at(key); }));
    const auto& first = c.runs.front();
    const double efficiency = bench::median(c.efficiency);
    const double side_efficiency = bench::median(c.side_by_side_efficiency);
    // What the same round would reach at its own ideal step (no overhead): samples scale with
    // step / ideal.
    std::vector<double> at_ideal;
    for (std::size_t i = 0; i < c.runs.size(); ++i)
      at_ideal.push_back(c.efficiency[i] * c.runs[i].step_ms / c.runs[i].ideal_ms);
    budgets.push_back({c.nodes, c.overlap, bubble_cap(first.pipelines, first.nodes_in_use), bench::median(at_ideal),
                       efficiency});
    std::printf(
        "%5d %7s %9s %9.2f %9.2f %7.2f %9.1f %7.3f %7.3f | %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | %9.2f %9.2f %7.1f%%\n",
        c.nodes, c.overlap ? "on" : "off", first.shape.c_str(), bench::median(pred), bench::median(step),
        bench::median(ratio), bench::median(sps), efficiency, side_efficiency, breakdown.at("compute_ms"),
                breakdown.at("p2p_wait_ms"), breakdown.at("allreduce_ms"), breakdown.at("optimizer_ms"),
                bench::median(control), breakdown.at("other_ms"), first.predicted_compute_ms, bench::median(ideal),
                100 * bench::median(overhead));
    nlohmann::ordered_json row;
    row["nodes"] = c.nodes;
    row["overlap_gradient_reduce"] = c.overlap;
    row["nodes_in_use"] = first.nodes_in_use;
    row["pipelines"] = first.shape;
    row["runs"] = c.runs.size();
    row["predicted_step_ms"] = bench::median(pred);
    row["step_ms"] = bench::median(step);
    row["step_over_predicted"] = bench::median(ratio);
    row["predicted_busiest_stage_compute_ms"] = number_or_null(first.predicted_compute_ms);
    row["samples_per_s"] = bench::median(sps);
    row["scaling_efficiency"] = efficiency;
    row["scaling_efficiency_side_by_side"] = side_efficiency;
    row["scaling_efficiency_bubble_cap"] = number_or_null(budgets.back().cap);
    row["scaling_efficiency_at_ideal"] = number_or_null(budgets.back().at_ideal);
    row["breakdown_median_ms"] = breakdown;
    const double overhead_median = bench::median(overhead);
    row["ideal_ms"] = number_or_null(bench::median(ideal));
    row["overhead"] = number_or_null(overhead_median);
    row["per_run"] = {{"step_ms", step},           {"predicted_step_ms", pred}, {"step_over_predicted", ratio},
                      {"scaling_efficiency", c.efficiency},
                      {"scaling_efficiency_side_by_side", c.side_by_side_efficiency},
                      {"overhead", overhead}};
    const double r = bench::median(ratio);
    row["targets"] = {{"prediction_within_15pct", std::abs(r - 1) <= 0.15 * r},
                      {"efficiency_ge_0.80", efficiency >= 0.80},
                      {"control_le_2ms", bench::median(control) <= 2.0},
                      {"overhead_le_10pct", overhead_median <= 0.10}};
    rows.push_back(row);
  }
  if (o.runs > 1) {
    std::printf("\nper run (round by round): step / predicted, efficiency\n");
    for (const auto& c : configurations) {
      std::printf("%5d %7s ", c.nodes, c.overlap ? "on" : "off");
      for (std::size_t i = 0; i < c.runs.size(); ++i)
        std::printf(" %.2f/%.3f", c.runs[i].step_ms / c.runs[i].predicted_ms, c.efficiency[i]);
      std::printf("\n");
    }
  }
  std::printf("\nwhere the efficiency goes (medians): the bubble's cap (layers split evenly at one process's speed)"
              "\n -> at the runs' own op times (ideal ms, no overhead) -> measured; the losses between them:\n");
  for (const auto& b : budgets)
    std::printf("%5d %7s   %.3f -> %.3f -> %.3f   bubble %.3f, the stages' op times %.3f, overhead %.3f\n", b.nodes,
                b.overlap ? "on" : "off", b.cap, b.at_ideal, b.measured, 1 - b.cap, b.cap - b.at_ideal,
                b.at_ideal - b.measured);
  nlohmann::ordered_json out;
  out["benchmark"] = "throughput";
  out["quick"] = o.quick;
  out["command"] = measured.command;
  out["global_batch"] = measured.global_batch;
  out["microbatch"] = measured.microbatch;
  out["layers"] = measured.layers;
  out["steps_per_run"] = o.steps;
  out["rounds"] = o.runs;
  out["profile_at_start"] = o.profile_at_start;
  out["profile_repeats"] = o.profile_repeats;
  out["warmup_steps"] = o.warmup;
  out["profile_microbatch_all_layers_ms"] = measured.profile_microbatch_ms;
  out["single_process_step_ms"] = single_median;
  out["single_process_step_ms_per_round"] = single_ms;
  out["single_process_samples_per_s"] = 1000.0 * measured.global_batch / single_median;
  out["single_process_side_by_side"] = side_json;
  out["load_average_1min"] = {measured.load_before, measured.load_after};
  out["allocator"] = bench::allocator_in_use();
  out["runs"] = rows;
  const fs::path json_path(o.json_path);
  if (json_path.has_parent_path()) fs::create_directories(json_path.parent_path());
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("\n(medians over the rounds; pipelines: nodes per pipeline; pred ms: the coordinator's predicted step\n"
              " (1F1B makespan with link costs, plus all-reduce and AdamW; from the bench's profile, or with\n"
              " --profile-at-start from the one a worker measured at the run's start); /pred: step / pred,\n"
              " the median of the runs' ratios; effic.: samples/s against nodes x the same round's single\n"
              " process; eff.sbs: the same against as many single processes run side by side (what this\n"
              " machine's cores compute at once; on separate machines the two are one); compute .. other: breakdown means, slowest stage, control less ahead_ms (the time a\n"
              " step's orders rode ahead of the previous commit's end); pred comp: the bench profile's compute\n"
              " of the busiest stage; ideal ms: the step's own 1F1B makespan from its measured op times plus\n"
              " all-reduce wait and AdamW; overhd: step / ideal - 1, the framework's overhead: control, waiting\n"
              " beyond the schedule, copies, digests; where the efficiency goes: the bubble's cap, then what\n"
              " the runs' ideal steps would reach (lost to the layers' uneven split and ops slower than in one\n"
              " process), then the measured efficiency (lost to the overhead))\n");
  std::printf("\nload average (1 min) %.2f before the cluster runs, %.2f after; JSON: %s\n", measured.load_before, measured.load_after,
              o.json_path.c_str());
}

}  // namespace oobleck::bench::throughput
