// How stable the profiler's figures are on this machine: the same model profiled several times,
// per layer the median forward and backward time of each run, the spread across runs, and the
// spread across the identical transformer blocks of one run. Tests check the profiler's
// arithmetic under a virtual clock; real timings depend on the machine's load and are read here.
//
// usage: profiler_stability [--quick] [--runs N] [--json PATH]

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "runtime/profiler.hpp"

using namespace oobleck;
using json = nlohmann::ordered_json;

namespace {

double spread(const std::vector<double>& xs) {
  const auto [lo, hi] = std::minmax_element(xs.begin(), xs.end());
  return *hi / *lo;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int runs = 5;
  std::string json_path = "profiler_stability.json";
  oobleck::bench::flag_set app{
      "profiler_stability: profiles one model N times and prints each layer's median forward and\n"
      "backward ms per run, their spread across runs (max / min) and across the identical blocks of each run.",
      "profiler_stability"};
  app.add_switch("--quick", quick, "2 runs (a smoke run)");
  app.add_integer("--runs", runs, 1, 1000, "profile the model N times (default 5; at least 2 are run)");
  app.add_text("--json", json_path, "write the results to PATH (default profiler_stability.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  runs = std::max(2, runs);
  if (quick) runs = 2;
  // The model of tests/runtime/profiler_test.cpp.
  const runtime::gpt_config model{.vocab = 128, .d_model = 64, .heads = 4, .blocks = 3, .seq_len = 32, .seed = 2};
  const runtime::profiler_options options{.microbatch = 4, .warmup = 2, .repeats = 9};
  std::vector<std::vector<runtime::layer_measurement>> all;
  for (int r = 0; r < runs; ++r) all.push_back(runtime::measure_layers(model, options));
  const int L = model.num_layers();

  std::printf("model: d_model %lld, %lld blocks, seq %lld, microbatch %d; median of %d repeats after %d warm-up; %d runs\n",
              static_cast<long long>(model.d_model), static_cast<long long>(model.blocks),
              static_cast<long long>(model.seq_len), options.microbatch, options.repeats, options.warmup, runs);
  std::printf("%-10s %-8s %-40s %10s %12s\n", "layer", "", "median ms per run", "runs max/min", "samples max/min");
  json layers_json = json::array();
  for (int l = 0; l < L; ++l) {
    for (int backward = 0; backward < 2; ++backward) {
      std::vector<double> medians, samples;
      std::string per_run;
      for (const auto& run : all) {
        const auto& m = run[l];
        medians.push_back(backward ? m.backward_ms : m.forward_ms);
        const auto& s = backward ? m.backward_samples : m.forward_samples;
        samples.insert(samples.end(), s.begin(), s.end());
        char cell[16];
        std::snprintf(cell, sizeof cell, " %7.3f", medians.back());
        per_run += cell;
      }
      std::printf("%-10s %-8s %-40s %10.2f %12.2f\n", backward ? "" : all[0][l].name.c_str(),
                  backward ? "backward" : "forward", per_run.c_str(), spread(medians), spread(samples));
      json medians_json = json::array();
      for (double x : medians) medians_json.push_back(x);
      layers_json.push_back(json{{"layer", all[0][l].name},
                                 {"pass", backward ? "backward" : "forward"},
                                 {"median_ms_per_run", medians_json},
                                 {"runs_max_over_min", spread(medians)},
                                 {"samples_max_over_min", spread(samples)}});
    }
  }
  // Identical blocks (layers 1..L-2) of one run.
  double worst_blocks = 1;
  for (const auto& run : all)
    for (int backward = 0; backward < 2; ++backward) {
      std::vector<double> blocks;
      for (int l = 1; l < L - 1; ++l) blocks.push_back(backward ? run[l].backward_ms : run[l].forward_ms);
      worst_blocks = std::max(worst_blocks, spread(blocks));
    }
  std::printf("identical blocks within one run: worst max/min of their medians %.2f\n", worst_blocks);
  std::ofstream(json_path) << json{{"benchmark", "profiler_stability"},
                                   {"runs", runs},
                                   {"layers", layers_json},
                                   {"blocks_max_over_min", worst_blocks}}
                                  .dump(2)
                           << "\n";
  return 0;
}
