// oobleck beside what a user would run instead (issue 26, "Beside PyTorch"): the same GPT-2 (the
// job's `gpt2` architecture and sizes, rebuilt from torch.nn by bench/vs_pytorch.py under Debian's
// python3-torch), the same global batch B, microbatch b, AdamW hyper-parameters, clipping and
// steps, trained by
//   (a) PyTorch DDP, gloo, on N processes (one intra-op thread each; B / (b N) microbatches of
//       gradient accumulation per process, all-reduce on the last), against
//   (b) oobleck-local on N nodes in its data-parallel configuration: slot memory large enough
//       that the model fits one node (n0 = 1) and f = N - 1, so the plan is N pipelines of one
//       stage (checked on the first metrics record: the run is refused otherwise), and
//   (c) oobleck-local on N nodes in a pipeline configuration: slot memory ~0.6 of the model's
//       (the synthetic profile's parameter state and activations), so that it does not fit one
//       node and pipelines have 2 stages (n0 = 2); the 1F1B bubble caps it at m / (m + S - 1) of
//       the data-parallel throughput (m microbatches per pipeline, S stages);
// and one process: PyTorch's single loop (one thread, B / b microbatches, one update) against
// actors::train_single_process (the library's single-process training, one LibTorch thread,
// in this process: the same loop every cluster run must equal).
//
// Runs alternate (ddp, ours data-parallel, ours pipeline, torch single, ours single) R times;
// each reports samples/s = B x measured steps / their wall time, the first `warmup` steps left
// out (PyTorch: process 0's clock around its steps; oobleck-local: the span between the
// warm-up's last and the run's last metrics records, i.e. commit to commit, every gap between
// steps included; train_single_process: the difference of two runs of warmup + steps and warmup
// steps). The medians of the R runs and their ratios are reported, unless the machine was busy:
// the 1-minute load average is read before and after every run, and when it was above --max-load
// before any run, no ratio is printed (the line says why).
#include <unistd.h>

#include <algorithm>
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

#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "bench/recovery_stats.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_toml.hpp"
#include "bench/single_process.hpp"
#include "planning/planner.hpp"
#include "planning/synthetic_profile.hpp"
#include "runtime/gpt_config.hpp"
#include "runtime/optimizer_options.hpp"

namespace fs = std::filesystem;
using namespace oobleck;

namespace {

const std::string apps_dir = OOBLECK_APPS_DIR;
const std::string script = std::string(OOBLECK_SOURCE_DIR) + "/bench/vs_pytorch.py";
const std::string python = "/usr/bin/python3";  // Debian's python3-torch imports there

struct options {
  bool quick = false;
  std::string json_path = "bench/results/vs_pytorch.json";
  int nodes = 2;
  int steps = 20;
  int warmup = 5;
  int runs = 5;
  std::string config;
  std::int64_t d_model = 0;  ///< 0: the job's
  std::int64_t seq_len = 0;  ///< 0: the job's
  double max_load = 2.5;
  bool pipeline = true;
  std::string pytorch_preload;  ///< a library PyTorch's processes run with (LD_PRELOAD); empty: none
};

std::optional<options> parse(int argc, char** argv, int& exit) {
  options o;
  bool no_pipeline = false;
  oobleck::bench::flag_set app{
      "vs_pytorch: oobleck-local beside PyTorch DDP (gloo) on the same GPT-2, global batch, microbatch,\n"
      "AdamW and steps (bench/vs_pytorch.py under /usr/bin/python3): data-parallel (N pipelines of one\n"
      "stage) and pipeline (2 stages per pipeline) configurations against DDP on N processes, and one\n"
      "process against PyTorch's single loop; R alternating runs, medians of samples/s and their ratio.\n"
      "No ratio is reported when the 1-minute load average was above --max-load before a run.\n"
      "Exits 0 with a SKIPPED line when /usr/bin/python3 cannot import torch.",
      "vs_pytorch"};
  app.add_switch("--quick", o.quick, "a smoke run: 1 run of each, 3 steps, 1 of them warm-up");
  app.add_text("--json", o.json_path, "write the results to PATH (default bench/results/vs_pytorch.json)");
  app.add_integer("--nodes", o.nodes, 2, 16, "N: processes of PyTorch DDP and nodes of oobleck-local (default 2)");
  app.add_integer("--steps", o.steps, 2, 1 << 20, "steps per run (default 20)");
  app.add_integer("--warmup", o.warmup, 1, 1 << 20, "first steps of each run left out (default 5)");
  app.add_integer("--runs", o.runs, 1, 1000, "R: alternating runs of each configuration (default 5)");
  app.add_text("--config", o.config,
               "the job file (default: oobleck-local's default job with [model] architecture = \"gpt2\");\n"
               "its architecture is set to gpt2 and its slot memory per configuration");
  app.add_integer("--d-model", o.d_model, 1, 1 << 16, "the model's d_model (default: the job's)");
  app.add_integer("--seq-len", o.seq_len, 1, 1 << 16, "the model's seq_len (default: the job's)");
  app.add_number("--max-load", o.max_load, 0.0,
                 "the 1-minute load average above which, before any run, the machine counts as busy and no\n"
                 "ratio is reported (default 2.5 on this 2-core machine: the runs themselves keep ~2 cores busy)");
  app.add_switch("--no-pipeline", no_pipeline, "leave out the pipeline configuration");
  app.add_text("--pytorch-preload", o.pytorch_preload,
               "run PyTorch's processes with LD_PRELOAD=LIB, e.g. /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4\n"
               "(the allocator our programs link: PyTorch's own tuning guide suggests tcmalloc or jemalloc);\n"
               "default: none, PyTorch as Debian's python3 runs it (glibc's malloc)")
      .type_name("LIB");
  if (const auto e = app.parse(argc, argv)) {
    exit = *e;
    return std::nullopt;
  }
  o.pipeline = !no_pipeline;
  if (o.quick) {
    o.runs = 1;
    o.steps = 3;
    o.warmup = 1;
  }
  if (o.warmup >= o.steps) {
    std::cerr << "error: --warmup must be smaller than --steps (see --help)\n";
    exit = 2;
    return std::nullopt;
  }
  if (!o.pytorch_preload.empty() && !fs::is_regular_file(o.pytorch_preload)) {
    std::cerr << "error: --pytorch-preload: no file " << o.pytorch_preload << " (see --help)\n";
    exit = 2;
    return std::nullopt;
  }
  return o;
}

/// One timed run: samples/s, the mean step, the load average before and after, and for
/// oobleck-local its plan and breakdown means.
struct run_result {
  double samples_per_s = NAN, step_ms = NAN, load_before = NAN, load_after = NAN;
  std::string shape;  ///< oobleck-local: nodes per pipeline, "+"-separated
  std::vector<std::pair<std::size_t, int>> pipelines;  ///< nodes and microbatches of each
  std::map<std::string, double> breakdown;
  double wall_ms = NAN;  ///< oobleck-local: mean wall_ms (run_step .. last commit acknowledged)
  double cpu_per_wall = NAN;  ///< PyTorch: process 0's CPU time (all threads) over wall time, measured steps
};

nlohmann::ordered_json to_json(const run_result& r) {
  nlohmann::ordered_json j;
  j["samples_per_s"] = r.samples_per_s;
  j["step_ms"] = r.step_ms;
  j["load_average_1min"] = {r.load_before, r.load_after};
  if (!std::isnan(r.cpu_per_wall)) j["cpu_per_wall"] = r.cpu_per_wall;
  if (!r.shape.empty()) {
    j["pipelines"] = r.shape;
    j["mean_wall_ms"] = r.wall_ms;
    j["breakdown_mean_ms"] = r.breakdown;
  }
  return j;
}

/// The PyTorch side: bench/vs_pytorch.py in `mode` with the job's model, batch and optimizer.
run_result run_torch(const options& o, const apps::job_file& job, const std::string& mode) {
  const auto& m = job.model;
  const auto& opt = job.optimizer;
  std::vector<std::string> args{script,
                                "--mode", mode,
                                "--nodes", std::to_string(o.nodes),
                                "--vocab", std::to_string(m.vocab),
                                "--d-model", std::to_string(m.d_model),
                                "--heads", std::to_string(m.heads),
                                "--blocks", std::to_string(m.blocks),
                                "--seq-len", std::to_string(m.seq_len),
                                "--global-batch", std::to_string(job.training.global_batch),
                                "--microbatch", std::to_string(job.training.microbatch),
                                "--steps", std::to_string(o.steps),
                                "--warmup", std::to_string(o.warmup),
                                "--seed", std::to_string(m.seed),
                                "--lr", bench::fmt("%.17g", opt.lr.peak),
                                "--beta1", bench::fmt("%.17g", opt.beta1),
                                "--beta2", bench::fmt("%.17g", opt.beta2),
                                "--eps", bench::fmt("%.17g", opt.eps),
                                "--weight-decay", bench::fmt("%.17g", opt.weight_decay),
                                "--warmup-steps", std::to_string(opt.lr.warmup_steps),
                                "--total-steps", std::to_string(opt.lr.total_steps),
                                "--min-lr", bench::fmt("%.17g", opt.lr.min_lr),
                                "--decay", std::string(runtime::lr_decay_name(opt.lr.decay)),
                                "--clip-norm", bench::fmt("%.17g", opt.clip_norm)};
  if (runtime::tied(m)) args.push_back("--tied");
  run_result r;
  r.load_before = bench::load_average_1min();
  // Through env(1), so that PyTorch's processes (and only theirs) get the preloaded library.
  if (!o.pytorch_preload.empty()) args.insert(args.begin(), {"LD_PRELOAD=" + o.pytorch_preload, python});
  const auto p = bench::run_program(o.pytorch_preload.empty() ? python : std::string("/usr/bin/env"), args, 900);
  r.load_after = bench::load_average_1min();
  if (p.status != 0 || p.lines.empty())
    throw std::runtime_error("vs_pytorch.py --mode " + mode + " failed (" + std::to_string(p.status) + "):\n" +
                             p.transcript());
  const auto j = nlohmann::json::parse(p.lines.back());
  r.step_ms = j.at("step_ms").get<double>();
  r.samples_per_s = j.at("samples_per_s").get<double>();
  r.cpu_per_wall = j.at("cpu_per_wall").get<double>();
  return r;
}

/// The oobleck side on N nodes: oobleck-local with the job file at `job_path` and f.
run_result run_ours(const options& o, const fs::path& dir, const std::string& job_path, int fault_tolerance,
                    int global_batch, const std::string& tag) {
  const auto metrics = dir / ("metrics-" + tag + ".jsonl");
  fs::remove(metrics);
  run_result r;
  r.load_before = bench::load_average_1min();
  const auto p = bench::run_program(apps_dir + "/oobleck-local",
                                    {"--nodes", std::to_string(o.nodes), "--config", job_path, "--steps",
                                     std::to_string(o.steps), "--fault-tolerance", std::to_string(fault_tolerance),
                                     "--metrics-out", metrics.string(), "--timeout", "500"},
                                    900);
  r.load_after = bench::load_average_1min();
  if (p.status != 0)
    throw std::runtime_error("oobleck-local (" + tag + ") failed (" + std::to_string(p.status) + "):\n" + p.transcript());
  const auto records = bench::read_metrics(metrics).steps;
  if (static_cast<int>(records.size()) != o.steps)
    throw std::runtime_error("oobleck-local (" + tag + ") wrote " + std::to_string(records.size()) + " step records, not " +
                             std::to_string(o.steps));
  std::ostringstream shape;
  for (const auto& pl : records.front()["pipelines"]) {
    shape << (shape.tellp() == 0 ? "" : "+") << pl["nodes"].size();
    r.pipelines.emplace_back(pl["nodes"].size(), pl["microbatches"].get<int>());
  }
  r.shape = shape.str();
  // The plan must hold for the whole run (a reconfiguration would change the work).
  for (const auto& rec : records)
    if (rec["pipelines"] != records.front()["pipelines"])
      throw std::runtime_error("oobleck-local (" + tag + ") changed its pipelines during the run");
  const double span_ms =
      records.back()["unix_ms"].get<double>() - records[static_cast<std::size_t>(o.warmup - 1)]["unix_ms"].get<double>();
  const int measured = o.steps - o.warmup;
  r.step_ms = span_ms / measured;
  r.samples_per_s = 1000.0 * global_batch * measured / span_ms;
  double wall = 0;
  for (int k = o.warmup; k < o.steps; ++k) {
    const auto& rec = records[static_cast<std::size_t>(k)];
    wall += rec["wall_ms"].get<double>();
    for (const char* key : bench::breakdown_keys) r.breakdown[key] += rec["breakdown"][key].get<double>() / measured;
    r.breakdown["ahead_ms"] += rec["breakdown"].value("ahead_ms", 0.0) / measured;
  }
  r.wall_ms = wall / measured;
  return r;
}

/// train_single_process: (time of warmup + steps) - (time of warmup), per step.
run_result run_ours_single(const options& o, const apps::job_file& job) {
  run_result r;
  r.load_before = bench::load_average_1min();
  r.step_ms = bench::single_process_step_ms(apps::stage_job_for(job), o.warmup, o.steps - o.warmup);
  r.load_after = bench::load_average_1min();
  r.samples_per_s = 1000.0 * job.training.global_batch / r.step_ms;
  return r;
}

/// Slot memory for the pipeline configuration on `nodes` nodes with f = `f`: the largest of
/// k x (the whole model's memory on the synthetic profile: 4 x parameter bytes + activations),
/// k = 0.95, 0.90, ..., 0.05, for which the planner (on that profile, as the coordinator plans a
/// job without a profile file) makes pipelines of 2 stages only. None when no k does.
std::optional<std::int64_t> pipeline_memory(const apps::job_file& job, int nodes, int f) {
  const auto profile = planning::synthetic_gpt_profile(apps::synthetic_model(job));
  double bytes = 0;
  for (const auto& l : profile.layers) bytes += 4.0 * static_cast<double>(l.param_bytes) + static_cast<double>(l.activation_bytes);
  for (int k = 95; k > 0; k -= 5) {
    auto trial = job;
    trial.cluster.device_memory_bytes = static_cast<std::int64_t>(bytes * k / 100);
    try {
      const auto plan = planning::plan_job(profile, apps::planner_job(trial, nodes, f));
      if (!plan.pipelines.empty() && std::all_of(plan.pipelines.begin(), plan.pipelines.end(),
                                                 [](const auto& p) { return p.nodes.size() == 2; }))
        return trial.cluster.device_memory_bytes;
    } catch (const std::exception&) {  // the model no longer fits N nodes: less memory fits worse
      break;
    }
  }
  return std::nullopt;
}

/// torch.__version__ under /usr/bin/python3; none when it cannot import torch.
std::optional<std::string> python_torch_version() {
  if (!fs::exists(python)) return std::nullopt;
  const auto r = bench::run_program(python, {"-c", "import torch; print(torch.__version__)"}, 120);
  if (r.status != 0 || r.lines.empty()) return std::nullopt;
  return r.lines.back();
}

struct series {
  std::vector<run_result> runs;
  std::vector<double> samples() const {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r.samples_per_s);
    return v;
  }
  double median_samples() const { return bench::median(samples()); }
  nlohmann::ordered_json json() const {
    nlohmann::ordered_json j;
    j["median_samples_per_s"] = median_samples();
    j["runs"] = nlohmann::json::array();
    for (const auto& r : runs) j["runs"].push_back(to_json(r));
    return j;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int exit = 0;
  const auto parsed = parse(argc, argv, exit);
  if (!parsed) return exit;
  const options& o = *parsed;
  const auto torch_version = python_torch_version();
  if (!torch_version) {
    std::printf("SKIPPED: %s cannot import torch (Debian: apt-get install python3-torch)\n", python.c_str());
    return 0;
  }
  try {
    const fs::path dir = fs::temp_directory_path() / ("oobleck-vs-pytorch-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct remove_on_exit {
      fs::path dir;
      ~remove_on_exit() {
        std::error_code ignored;
        fs::remove_all(dir, ignored);
      }
    } const cleanup{dir};

    std::string job_text;
    if (o.config.empty()) {
      job_text = bench::default_job_text(apps_dir);
    } else {
      if (!fs::is_regular_file(o.config)) throw std::runtime_error("cannot read " + o.config);
      apps::read_job_file(o.config);  // a bad file is refused under its own name
      job_text = apps::job_text_for_workers(bench::read_text(o.config), o.config);
    }
    std::vector<bench::toml_key> keys{{"model", "architecture", std::string("gpt2")},
                                      {"training", "steps", static_cast<std::int64_t>(o.steps)}};
    if (o.d_model) keys.push_back({"model", "d_model", o.d_model});
    if (o.seq_len) keys.push_back({"model", "seq_len", o.seq_len});
    job_text = bench::with_keys(job_text, keys);
    auto write_job = [&](const std::string& name, std::int64_t memory) {
      const auto path = dir / name;
      std::ofstream(path) << bench::with_keys(job_text, {{"cluster", "device_memory_bytes", memory}});
      return path.string();
    };
    const std::string dp_path = write_job("job-data-parallel.toml", std::int64_t{1} << 40);
    const auto job = apps::read_job_file(dp_path);
    if (job.model.dropout != 0)
      throw std::runtime_error("the job has [model] dropout = " + bench::fmt("%g", job.model.dropout) +
                               "; the PyTorch model has none: set it to 0 for the same work");
    const int B = job.training.global_batch, b = job.training.microbatch;
    if (B % (b * o.nodes))
      throw std::runtime_error("the global batch " + std::to_string(B) + " is not a multiple of microbatch x nodes = " +
                               std::to_string(b * o.nodes) + ": the processes could not share it equally");
    const int pipe_f = std::max(0, o.nodes / 2 - 1);
    const auto pipe_memory = o.pipeline ? pipeline_memory(job, o.nodes, pipe_f) : std::nullopt;
    if (o.pipeline && !pipe_memory)
      throw std::runtime_error("no slot memory makes the planner form pipelines of 2 stages for this job on " +
                               std::to_string(o.nodes) + " nodes (--no-pipeline leaves that configuration out)");
    const std::int64_t pipe_memory_bytes = pipe_memory.value_or(0);  // 0: no pipeline configuration
    const std::string pipe_path = o.pipeline ? write_job("job-pipeline.toml", pipe_memory_bytes) : "";

    std::printf("vs_pytorch: gpt2, vocab %lld, d_model %lld, %lld heads, %lld blocks, seq_len %lld%s; B = %d, b = %d;\n"
                "N = %d; %d steps per run, first %d left out; %d alternating runs; load average %s%s\n",
                static_cast<long long>(job.model.vocab), static_cast<long long>(job.model.d_model),
                static_cast<long long>(job.model.heads), static_cast<long long>(job.model.blocks),
                static_cast<long long>(job.model.seq_len), runtime::tied(job.model) ? ", tied" : "", B, b, o.nodes,
                o.steps, o.warmup, o.runs, bench::load_average().c_str(),
                o.pytorch_preload.empty() ? "" : ("; PyTorch with LD_PRELOAD=" + o.pytorch_preload).c_str());
    std::fflush(stdout);

    series ddp, ours_dp, ours_pipe, torch_single, ours_single;
    double max_load_before = 0;
    auto note = [&](const char* what, const run_result& r) {
      max_load_before = std::max(max_load_before, r.load_before);
      std::printf("  %-26s %9.1f samples/s  %8.2f ms/step  load %.2f -> %.2f%s%s%s\n", what, r.samples_per_s, r.step_ms,
                  r.load_before, r.load_after, r.shape.empty() ? "" : "  pipelines ", r.shape.c_str(),
                  std::isnan(r.cpu_per_wall) ? "" : bench::fmt("  cpu/wall %.2f", r.cpu_per_wall).c_str());
      std::fflush(stdout);
    };
    for (int k = 0; k < o.runs; ++k) {
      std::printf("run %d of %d\n", k + 1, o.runs);
      ddp.runs.push_back(run_torch(o, job, "ddp"));
      note("PyTorch DDP (gloo)", ddp.runs.back());
      ours_dp.runs.push_back(run_ours(o, dir, dp_path, o.nodes - 1, B, "data-parallel"));
      note("oobleck data-parallel", ours_dp.runs.back());
      const auto& planned = ours_dp.runs.back().pipelines;
      if (planned.size() != static_cast<std::size_t>(o.nodes) ||
          !std::all_of(planned.begin(), planned.end(), [](const auto& p) { return p.first == 1; }))
        throw std::runtime_error("the data-parallel configuration planned pipelines " + ours_dp.runs.back().shape +
                                   ", not " + std::to_string(o.nodes) + " pipelines of one node");
      if (o.pipeline) {
        ours_pipe.runs.push_back(run_ours(o, dir, pipe_path, pipe_f, B, "pipeline"));
        note("oobleck pipeline", ours_pipe.runs.back());
      }
      torch_single.runs.push_back(run_torch(o, job, "single"));
      note("PyTorch single process", torch_single.runs.back());
      ours_single.runs.push_back(run_ours_single(o, job));
      note("oobleck single process", ours_single.runs.back());
    }

    const bool busy = max_load_before > o.max_load;
    // The pipeline configuration's stages and microbatches (its first run's plan).
    int stages = 0, m = 0;
    bool pipe_two_stages = false;
    if (o.pipeline) {
      const auto& pl = ours_pipe.runs.front().pipelines;
      stages = static_cast<int>(pl.front().first);
      m = pl.front().second;
      pipe_two_stages = std::all_of(pl.begin(), pl.end(), [](const auto& p) { return p.first == 2; });
    }
    const double bubble = o.pipeline ? static_cast<double>(m) / (m + stages - 1) : NAN;

    auto ratio_line = [&](const char* what, const series& ours, const series& theirs) {
      const double r = ours.median_samples() / theirs.median_samples();
      if (busy)
        std::printf("%-40s ours %9.1f, PyTorch %9.1f samples/s (medians): no ratio, the machine was busy\n", what,
                    ours.median_samples(), theirs.median_samples());
      else
        std::printf("%-40s ours %9.1f, PyTorch %9.1f samples/s (medians): ours/PyTorch %.3f\n", what,
                    ours.median_samples(), theirs.median_samples(), r);
      return busy ? nlohmann::json(nullptr) : nlohmann::json(r);
    };
    std::printf("\n");
    nlohmann::ordered_json ratios;
    ratios["data_parallel_vs_ddp"] = ratio_line("data-parallel vs DDP:", ours_dp, ddp);
    if (o.pipeline) {
      ratios["pipeline_vs_ddp"] = ratio_line("pipeline vs DDP:", ours_pipe, ddp);
      std::printf("  pipeline plan: %s nodes per pipeline, %d stages x %d microbatches; 1F1B bubble bound m/(m+S-1) = "
                  "%d/%d = %.3f of the data-parallel throughput at best%s\n",
                  ours_pipe.runs.front().shape.c_str(), stages, m, m, m + stages - 1, bubble,
                  pipe_two_stages ? "" : " (NOT 2 stages per pipeline: the slot memory did not give n0 = 2)");
    }
    ratios["single_vs_single"] = ratio_line("one process vs PyTorch's single loop:", ours_single, torch_single);
    const auto& bd = ours_dp.runs;
    std::printf("\noobleck data-parallel, breakdown (ms per step, median over the runs of each run's mean):");
    for (const char* key : bench::breakdown_keys) {
      std::vector<double> v;
      for (const auto& r : bd) v.push_back(r.breakdown.at(key));
      std::printf(" %s %.2f", key, bench::median(v));
    }
    // Run-ahead: a step's orders go out with the previous commit, ahead_ms before its wall time
    // starts; its parts (control_ms among them) are counted from the orders.
    std::vector<double> ahead, critical_control;
    for (const auto& r : bd) {
      ahead.push_back(r.breakdown.at("ahead_ms"));
      critical_control.push_back(r.breakdown.at("control_ms") - r.breakdown.at("ahead_ms"));
    }
    std::printf(" (ahead_ms %.2f: control on the critical path %.2f)", bench::median(ahead),
                bench::median(critical_control));
    std::vector<double> walls, steps_ms;
    for (const auto& r : bd) {
      walls.push_back(r.wall_ms);
      steps_ms.push_back(r.step_ms);
    }
    std::printf("; wall_ms %.2f of %.2f ms commit to commit\n", bench::median(walls), bench::median(steps_ms));
    if (busy)
      std::printf("NO RATIO: the 1-minute load average was %.2f before a run, above --max-load %.2f: the machine was "
                  "busy (other work shares its cores); run again when `uptime` shows it quiet\n",
                  max_load_before, o.max_load);

    nlohmann::ordered_json out;
    out["benchmark"] = "vs_pytorch";
    out["quick"] = o.quick;
    out["command"] = [&] {
      std::string c;
      for (int i = 0; i < argc; ++i) c += (i ? " " : "") + std::string(argv[i]);
      return c;
    }();
    out["model"] = {{"architecture", "gpt2"},        {"vocab", job.model.vocab},   {"d_model", job.model.d_model},
                    {"heads", job.model.heads},      {"blocks", job.model.blocks}, {"seq_len", job.model.seq_len},
                    {"tied", runtime::tied(job.model)}};
    out["global_batch"] = B;
    out["microbatch"] = b;
    out["nodes"] = o.nodes;
    out["steps_per_run"] = o.steps;
    out["warmup_steps"] = o.warmup;
    out["runs"] = o.runs;
    out["cores"] = std::thread::hardware_concurrency();
    out["max_load"] = o.max_load;
    out["max_load_before_a_run"] = max_load_before;
    out["busy"] = busy;
    out["oobleck_allocator"] = bench::allocator_in_use();
    out["pytorch"] = *torch_version;
    out["pytorch_preload"] =
        o.pytorch_preload.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.pytorch_preload);
    out["pytorch_ddp"] = ddp.json();
    out["oobleck_data_parallel"] = ours_dp.json();
    if (o.pipeline) {
      out["oobleck_pipeline"] = ours_pipe.json();
      out["pipeline_slot_memory_bytes"] = pipe_memory_bytes;
      out["pipeline_stages"] = stages;
      out["pipeline_microbatches"] = m;
      out["pipeline_bubble_bound"] = bubble;
    }
    out["pytorch_single"] = torch_single.json();
    out["oobleck_single"] = ours_single.json();
    out["ratios_ours_over_pytorch"] = ratios;
    const fs::path json_path(o.json_path);
    if (json_path.has_parent_path()) fs::create_directories(json_path.parent_path());
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("JSON: %s\n", o.json_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "vs_pytorch: " << e.what() << "\n";
    return 1;
  }
}
