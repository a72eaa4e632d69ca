#pragma once
// bench/throughput's figures and their report: one configuration's cluster runs, what the rounds
// measured beside them (the single process, alone and side by side), and the table, the efficiency
// budget and the JSON that bench/throughput prints and writes from them (throughput.cpp runs them).

#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace oobleck::bench::throughput {

/// The benchmark's flags (throughput.cpp parses them).
struct options {
  bool quick = false;
  std::string json_path = "bench/results/throughput.json";
  std::vector<int> nodes{2, 4, 6};
  int steps = 14;   ///< per run
  int warmup = 4;   ///< first steps left out of the means
  std::string config;  ///< job file; default: oobleck-local's default job
  /// Microbatches the profile times (oobleck-profile --repeats): more than a job's default of 7,
  /// so that the profile spans seconds, as the cluster runs do (see the top of this file).
  int profile_repeats = 200;
  int runs = 5;                   ///< alternating rounds; each figure is the median over them
  bool profile_at_start = false;  ///< the coordinator profiles the model at each run's start
  /// JOB WARMUP STEPS: this program as one of the single processes run side by side (the
  /// benchmark starts them so).
  std::vector<std::string> side_by_side_child;
};

struct run_result {
  int nodes = 0;
  bool overlap = true;
  int nodes_in_use = 0;
  std::string shape;  ///< pipelines x stages
  double predicted_ms = NAN;          ///< the coordinator's plan: its predicted step (metrics' predicted_ms)
  double predicted_compute_ms = NAN;  ///< the profile's compute of the busiest stage (Nb x its fwd + bwd)
  /// The coordinator's pipelines (its first step's metrics record): nodes and microbatches of
  /// each, sorted; the bench's plan must be the same (a cross-check of the prediction's inputs).
  std::vector<std::pair<std::size_t, int>> pipelines;
  double step_ms = 0;  ///< mean wall_ms of the measured steps
  /// Mean ideal_ms of the measured steps (the metrics': the slowest pipeline's 1F1B makespan from
  /// its own op times, plus all-reduce wait and AdamW); NAN when a step had none.
  double ideal_ms = NAN;
  double samples_per_s = 0;
  std::map<std::string, double> breakdown;  ///< means
};

/// What the planner predicts for the job on `nodes` nodes with the measured profile, as the
/// coordinator plans it (same function, same inputs): the step's makespan, the compute time of
/// its busiest stage (Nb x Σ fwd + bwd of the stage's layers), and its pipelines (nodes and
/// microbatches of each, sorted).
struct predicted {
  double step_ms = NAN, busiest_compute_ms = NAN;
  std::vector<std::pair<std::size_t, int>> pipelines;
};

/// One configuration's runs, one per round.
struct configuration {
  int nodes = 0;
  bool overlap = true;
  predicted bench_plan;  ///< the planner on the bench's profile (the coordinator's, without --profile-at-start)
  std::vector<run_result> runs;
  std::vector<double> efficiency;  ///< against the same round's single process
  /// Against the same round's single processes run side by side, as many as the nodes.
  std::vector<double> side_by_side_efficiency;
};

/// What the rounds measured beside the cluster runs, and the job they ran.
struct rounds {
  int global_batch = 0, microbatch = 0, layers = 0;
  double profile_microbatch_ms = NAN;  ///< the profile's one microbatch through every layer
  std::vector<double> single_ms;       ///< the single process's step, round by round
  std::map<int, std::vector<double>> side_ms;  ///< copies -> each round's mean step of the copies
  double load_before = NAN, load_after = NAN;  ///< 1-minute load averages around the cluster runs
  std::string command;                         ///< this invocation, as typed
};

/// Prints the table, the per-run figures and where each configuration's efficiency goes, and
/// writes the JSON to o.json_path.
void report(const options& o, const std::vector<configuration>& configurations, const rounds& measured);

}  // namespace oobleck::bench::throughput
