// Failure-free throughput of oobleck-local (issue 7, "Benchmark"): for 2, 4 and 6 worker
// processes, the measured step time against (a) the planner's predicted step time from a profile
// measured here by oobleck-profile (same model and microbatch) and (b) the single-process run of
// the same model and global batch, as scaling efficiency; and the per-step breakdown (compute, p2p
// wait, all-reduce, optimizer, control messages) of the --metrics-out records.
//
//   throughput (samples/s)   = B × measured steps / Σ wall_ms of those steps (warm-up steps
//                              excluded; wall_ms: run_step sent .. last commit acknowledged)
//   single-process throughput = B × steps / wall time of those steps of train_single_process
//                              (one process, one LibTorch thread, every layer, the whole batch)
//   scaling efficiency       = throughput / (nodes in use × single-process throughput)
//
// Each configuration runs with the gradient all-reduce overlapped (the default) and, to measure
// its effect, without (training.overlap_gradient_reduce = false).
//
// --runs R (default 5) repeats the whole set R times, alternating: the single process, then every
// cluster configuration, then again. Each figure is the median over the R rounds, efficiency
// against the same round's single process: this VM runs the same work at two speeds ~1.5x apart
// that alternate every few seconds (bench/RESULTS.md), so one run of each proves little.
// --profile-at-start leaves the job without a profile file, so that the coordinator has a worker
// profile the model at the start of every run (the job's [profile] repeats) and plans from that,
// as a user's job does: the predicted step is then the one the job prints ("forming epoch ...
// predicted step"), read from each run's metrics (predicted_ms).
//
// The profile times 200 microbatches (--profile-repeats), not a job's default 7: 7 span ~30 ms of
// the default job's compute, and this VM runs identical work at speeds up to 1.5x apart for
// seconds at a time, so such a profile predicted the same job 1.5x apart between runs.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "actors/stage.hpp"
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_toml.hpp"
#include "bench/recovery_stats.hpp"
#include "bench/single_process.hpp"
#include "bench/throughput_report.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "runtime/child_process.hpp"

namespace fs = std::filesystem;
using namespace oobleck;
using namespace oobleck::bench::throughput;

namespace {

const std::string apps_dir = OOBLECK_APPS_DIR;


/// The flags; none when main should end at once with `exit` (after --help, or a bad flag).
std::optional<options> parse(int argc, char** argv, int& exit) {
  options o;
  std::string nodes;
  oobleck::bench::flag_set app{
      "throughput: failure-free throughput of oobleck-local against the planner's prediction (a profile\n"
      "measured here by oobleck-profile, R timed microbatches) and the single-process run.",
      "throughput"};
  app.add_switch("--quick", o.quick, "2 nodes, 3 steps, R = 2 (a smoke run)");
  app.add_text("--json", o.json_path, "write the results to PATH (default bench/results/throughput.json)");
  app.add_text("--nodes", nodes, "node counts to run, in 1..64, separated by commas (default 2,4,6)").type_name("LIST");
  app.add_integer("--steps", o.steps, 1, 1 << 20, "steps per run (default 14)");
  app.add_integer("--warmup", o.warmup, 0, 1 << 20, "first steps of each run left out of the means (default 4)");
  app.add_text("--config", o.config, "the job file (default: oobleck-local's default job)").type_name("JOB.toml");
  app.add_integer("--profile-repeats", o.profile_repeats, 1, 1000,
                  "microbatches the profile times (oobleck-profile --repeats; default 200)");
  app.add_integer(
      "--runs", o.runs, 1, 100,
      "alternating rounds of the single process and every cluster configuration; medians over them (default 5)");
  app.add_switch(
      "--profile-at-start", o.profile_at_start,
      "no profile file: the coordinator profiles the model at each run's start (the job's [profile] repeats)\n"
      "and predicts from that, as a user's job does; the prediction is each run's own");
  app.add_internal_words("--side-by-side-child", o.side_by_side_child, 3,
                         "run as one of the single processes run side by side (the benchmark starts them so)");
  if (const auto e = app.parse(argc, argv)) {
    exit = *e;
    return std::nullopt;
  }
  auto usage_error = [&](const std::string& what) {
    std::cerr << "error: " << what << " (see --help)\n";
    exit = 2;
    return std::nullopt;
  };
  if (!nodes.empty()) {
    o.nodes.clear();
    std::stringstream in(nodes);
    for (std::string part; std::getline(in, part, ',');) {
      try {
        std::size_t used = 0;
        const int n = std::stoi(part, &used);
        if (used != part.size() || n < 1 || n > 64) throw std::out_of_range(part);
        o.nodes.push_back(n);
      } catch (const std::exception&) {
        return usage_error("--nodes takes node counts in 1..64 separated by commas, got \"" + part + "\"");
      }
    }
    if (o.nodes.empty()) return usage_error("--nodes is empty");
  }
  if (o.quick) {
    o.nodes = {2};
    o.steps = 3;
    o.warmup = 1;
    o.profile_repeats = 2;
    o.runs = 1;
  }
  if (o.warmup >= o.steps) return usage_error("--warmup must be smaller than --steps");
  return o;
}

/// Runs one of the project's programs (no shell) with its stdout and stderr in `log`; its exit
/// status and that output.
std::pair<int, std::string> run(const std::string& program, const std::vector<std::string>& args, const fs::path& log) {
  runtime::child_process child(apps_dir + "/" + program, args,
                               runtime::child_streams{runtime::child_output::file(log.string())});
  const int status = child.wait();
  return {status, bench::read_text(log)};
}


run_result run_cluster(const options& o, const fs::path& dir, const std::string& job_path, int nodes, bool overlap,
                       int global_batch) {
  run_result r;
  r.nodes = nodes;
  r.overlap = overlap;
  const auto metrics = dir / ("metrics-" + std::to_string(nodes) + (overlap ? "" : "-sequential") + ".jsonl");
  std::vector<std::string> args{"--nodes", std::to_string(nodes), "--config", job_path, "--steps", std::to_string(o.steps),
                                "--metrics-out", metrics.string(), "--timeout", "500"};
  // f = 1 needs at least 2 n0 nodes; with 2 nodes the job runs with f = 0 (one pipeline).
  if (nodes < 4) args.insert(args.end(), {"--fault-tolerance", "0"});
  const auto [status, out] = run("oobleck-local", args, fs::path(metrics).replace_extension(".log"));
  if (status != 0) throw std::runtime_error("oobleck-local --nodes " + std::to_string(nodes) + " failed (" +
                                           std::to_string(status) + "):\n" + out);
  int k = 0;
  double wall = 0;
  std::map<std::string, double> sums;
  double ideal = 0;
  for (const auto& j : bench::read_metrics(metrics).steps) {
    if (k == 0) {
      std::ostringstream shape;
      for (const auto& p : j["pipelines"]) {
        shape << (shape.tellp() == 0 ? "" : "+") << p["nodes"].size();
        r.nodes_in_use += static_cast<int>(p["nodes"].size());
        r.pipelines.emplace_back(p["nodes"].size(), p["microbatches"].get<int>());
      }
      std::sort(r.pipelines.begin(), r.pipelines.end());
      r.shape = shape.str();
    }
    if (k++ < o.warmup) continue;
    if (std::isnan(r.predicted_ms)) r.predicted_ms = j.value("predicted_ms", NAN);
    wall += j["wall_ms"].get<double>();
    ideal += j.contains("ideal_ms") ? j["ideal_ms"].get<double>() : NAN;
    for (const char* key : bench::breakdown_keys) sums[key] += j["breakdown"][key].get<double>();
    sums["ahead_ms"] += j["breakdown"].value("ahead_ms", 0.0);
  }
  const int measured = k - o.warmup;
  if (measured <= 0) throw std::runtime_error("no measured steps in " + metrics.string());
  r.step_ms = wall / measured;
  r.ideal_ms = ideal / measured;
  r.samples_per_s = 1000.0 * global_batch * measured / wall;
  for (auto& [key, sum] : sums) r.breakdown[key] = sum / measured;
  return r;
}

/// What the planner predicts for the job on `nodes` nodes with the measured profile, as the
/// coordinator plans it (same function, same inputs).
predicted prediction(const planning::profile& profile, const apps::job_file& job, int nodes) {
  // f = 1 needs at least 2 n0 nodes; with 2 nodes the job runs with f = 0, as run_cluster starts it.
  const auto plan = planning::plan_job(profile, apps::planner_job(job, nodes, nodes < 4 ? 0 : job.cluster.fault_tolerance));
  double busiest = 0;
  for (const auto& p : plan.pipelines) {
    const auto* t = plan.templates.find(p.template_nodes);
    if (!t) throw std::logic_error("the plan uses a template of " + std::to_string(p.template_nodes) + " nodes it lacks");
    for (const auto& s : t->stages) busiest = std::max(busiest, p.microbatches * s.ms);
  }
  predicted out{plan.step_ms, busiest, {}};
  for (const auto& p : plan.pipelines) out.pipelines.emplace_back(p.nodes.size(), p.microbatches);
  std::sort(out.pipelines.begin(), out.pipelines.end());
  return out;
}

/// The job's profile, measured by oobleck-profile timing `repeats` microbatches.
planning::profile measure_profile(const fs::path& dir, const fs::path& job, int repeats) {
  const auto out = (dir / "profile.json").string();
  const auto [status, log] = run("oobleck-profile", {"--config", job.string(), "--out", out, "--repeats", std::to_string(repeats)},
                                 dir / "profile.log");
  if (status != 0) throw std::runtime_error("oobleck-profile failed (" + std::to_string(status) + "):\n" + log);
  return messages::read_profile_file(out);
}

/// Σ_l fwd + bwd at width 1: one microbatch through every layer.
double microbatch_ms(const planning::profile& profile) {
  double sum = 0;
  for (const auto& l : profile.layers) sum += l.forward_ms.at(0) + l.backward_ms.at(0);
  return sum;
}


}  // namespace

int main(int argc, char** argv) {
  int exit = 0;
  const auto parsed = parse(argc, argv, exit);
  if (!parsed) return exit;
  const options& o = *parsed;
  if (!o.side_by_side_child.empty()) {
    try {
      return bench::side_by_side_child(o.side_by_side_child);
    } catch (const std::exception& e) {
      std::cerr << "throughput (side-by-side single process): " << e.what() << "\n";
      return 1;
    }
  }
  try {
    const fs::path dir = fs::temp_directory_path() / ("oobleck-throughput-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct remove_on_exit {  // on every way out, errors included
      fs::path dir;
      ~remove_on_exit() {
        std::error_code ignored;
        fs::remove_all(dir, ignored);
      }
    } const cleanup{dir};
    // The job: the given file, or oobleck-local's default job, with the measured profile.
    std::string job_text;
    if (o.config.empty()) {
      job_text = bench::default_job_text(apps_dir);
    } else {
      if (!fs::is_regular_file(o.config)) throw std::runtime_error("cannot read " + o.config);
      job_text = bench::read_text(o.config);
      apps::read_job_file(o.config);  // a bad file is refused under its own name
    }
    const auto plain_job = dir / "job.toml";
    std::ofstream(plain_job) << job_text;
    const auto job = apps::read_job_file(plain_job.string());

    const auto profile = measure_profile(dir, plain_job, o.profile_repeats);
    const auto profile_path = (dir / "profile.json").string();
    const double layer_sum_ms = microbatch_ms(profile);

    // The job file with [profile] file (none with --profile-at-start) and the overlap switch.
    auto write_job = [&](bool overlap) {
      const auto path = dir / (overlap ? "job-overlap.toml" : "job-sequential.toml");
      std::vector<bench::toml_key> keys{{"training", "overlap_gradient_reduce", overlap}};
      if (!o.profile_at_start) keys.push_back({"profile", "file", profile_path});
      std::ofstream(path) << bench::with_keys(job_text, keys);
      return path.string();
    };
    const std::string job_overlap = write_job(true), job_sequential = write_job(false);

    std::vector<configuration> configurations;
    for (int n : o.nodes)
      for (bool overlap : {true, false}) {
        if (o.quick && !overlap) continue;
        configurations.push_back({n, overlap, prediction(profile, job, n), {}, {}, {}});
      }
    std::vector<double> single_ms;
    std::map<int, std::vector<double>> side_ms;  ///< copies -> each round's mean step of the copies
    const double load_before = bench::load_average_1min();
    for (int round = 0; round < o.runs; ++round) {
      single_ms.push_back(bench::single_process_step_ms(apps::stage_job_for(job), o.warmup, o.steps - o.warmup));
      const double single_sps = 1000.0 * job.training.global_batch / single_ms.back();
      std::map<int, double> side_sps;
      for (int n : o.nodes) {
        if (side_sps.contains(n)) continue;
        const auto each = bench::side_by_side_step_ms(dir, plain_job, n, o.warmup, o.steps - o.warmup);
        double sum = 0;
        for (double x : each) sum += x;
        side_ms[n].push_back(sum / n);
        side_sps[n] = 1000.0 * job.training.global_batch / side_ms[n].back();
      }
      for (auto& c : configurations) {
        auto r = run_cluster(o, dir, c.overlap ? job_overlap : job_sequential, c.nodes, c.overlap, job.training.global_batch);
        r.predicted_compute_ms = o.profile_at_start ? NAN : c.bench_plan.busiest_compute_ms;
        if (!o.profile_at_start) {
          // The coordinator planned the same job on the same profile: the same pipelines and step.
          if (r.pipelines != c.bench_plan.pipelines) {
            auto text = [](const std::vector<std::pair<std::size_t, int>>& v) {
              std::string t;
              for (const auto& [size, mb] : v) t += " " + std::to_string(size) + "x" + std::to_string(mb);
              return t;
            };
            throw std::logic_error("the coordinator's pipelines (nodes x microbatches):" + text(r.pipelines) +
                                   "; the bench's plan:" + text(c.bench_plan.pipelines));
          }
          if (!(std::abs(r.predicted_ms - c.bench_plan.step_ms) <= 1e-6 * c.bench_plan.step_ms))
            throw std::logic_error("the coordinator predicted " + std::to_string(r.predicted_ms) + " ms, the bench's plan " +
                                   std::to_string(c.bench_plan.step_ms) + " ms on the same profile");
        }
        c.efficiency.push_back(r.samples_per_s / (r.nodes_in_use * single_sps));
        c.side_by_side_efficiency.push_back(r.samples_per_s / (r.nodes_in_use * side_sps.at(c.nodes)));
        c.runs.push_back(std::move(r));
      }
      if (o.runs > 1) std::fprintf(stderr, "round %d of %d done\n", round + 1, o.runs);
    }
    report(o, configurations,
           {job.training.global_batch, job.training.microbatch, job.model.num_layers(), layer_sum_ms,
            std::move(single_ms), std::move(side_ms), load_before, bench::load_average_1min(), [&] {
              std::string c;
              for (int i = 0; i < argc; ++i) c += (i ? " " : "") + std::string(argv[i]);
              return c;
            }()});
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "throughput: " << e.what() << "\n";
    return 1;
  }
}
