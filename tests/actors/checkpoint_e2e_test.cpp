// Checkpoints end to end (issue 8, item 5): oobleck-local with worker processes.
//  - More losses than the policy absorbs (a whole pipeline of a 6-node f = 1 job killed with
//    kill -9, leaving 3 < (f+1)·n0 = 4 nodes, every layer still held): the survivors write a
//    checkpoint, the job exits with status 4 (--exit-below-minimum: by default it would wait for
//    nodes, tests/actors/wait_for_nodes_e2e_test.cpp), the metrics record says so; resuming it on another
//    node count (4) continues the failure-free single-process run's loss curve within 1e-4, and
//    its final state (parameters and AdamW moments, written by a periodic checkpoint) equals the
//    single-process run's within 1e-4 relative.
//  - Periodic checkpoints (--checkpoint-every): written after the right commits, valid, holding
//    the reference run's state; a truncated or foreign one is refused at resume, nothing trained.
//  - SIGTERM to oobleck-local (issue 23): a checkpoint first, then the stop; its first writer dies
//    mid-write (a test hook: SIGKILL after half a file) and another holder writes its layers; the
//    resume continues the failure-free loss curve.
// What each run did is read from the coordinator's events (--events-out) and the metrics, never from
// log lines. Every wait has a deadline.

#include <torch/torch.h>  // before doctest (ARCHITECTURE.md §8)

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/stage_checkpoint.hpp"
#include "apps/checkpoint_job.hpp"
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "runtime/checkpoint.hpp"
#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;
using messages::stop_outcome;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string& default_job_text() {
  static const std::string text = [] {
    const auto r = run_process(bin + "/oobleck-local", {"--print-default-job"});
    REQUIRE(r.exit_status == 0);
    return r.out;
  }();
  return text;
}

/// The default job on `nodes` nodes (f = 1, the default slot memory: n0 = 2).
std::string job_text(int nodes) {
  std::string text = default_job_text();
  const auto at = text.find("\nnodes = ");
  REQUIRE(at != std::string::npos);
  text.replace(at + 1, text.find('\n', at + 1) - at - 1, "nodes = " + std::to_string(nodes));
  return text;
}

/// A scratch directory, removed at the end.
struct scratch {
  fs::path dir;
  scratch() {
    static int n = 0;
    dir = fs::temp_directory_path() / ("oobleck-ckpt-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() { fs::remove_all(dir); }
};

using run_result = local_run;

run_result run_local(const fs::path& dir, const std::string& job, int steps, const std::vector<std::string>& extra,
                     const std::function<void(running_local&)>& during = {}) {
  static int counter = 0;
  const auto tag = std::to_string(counter++);
  std::ofstream(dir / ("job" + tag + ".toml")) << job;
  const auto metrics = (dir / ("metrics" + tag + ".jsonl")).string();
  std::vector<std::string> args{"--config", (dir / ("job" + tag + ".toml")).string(), "--steps", std::to_string(steps),
                                "--metrics-out", metrics, "--timeout", "200"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_to_end(bin + "/oobleck-local", args, metrics, (dir / ("events" + tag + ".jsonl")).string(),
                    std::chrono::seconds(220), during);
}

/// The single-process run of the default job: losses and every layer's final state.
struct reference_run {
  std::vector<double> losses;
  std::vector<std::vector<std::byte>> layers;
};
reference_run reference(int steps) {
  reference_run r;
  r.losses = actors::train_single_process(apps::stage_job_for(apps::parse_job(default_job_text(), "job")),
                                          static_cast<std::uint64_t>(steps), &r.layers);
  return r;
}

void check_losses(const run_result& r, const reference_run& ref, int first, int end) {
  REQUIRE(static_cast<int>(r.steps.size()) == end - first);
  for (int k = first; k < end; ++k) {
    const auto& m = r.steps[static_cast<std::size_t>(k - first)];
    CAPTURE(m.dump());
    CHECK(m["step"] == k);
    CHECK(m["samples"] == 16);
    const double want = ref.losses.at(static_cast<std::size_t>(k));
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

/// Every layer of the checkpoint in `dir` holds the reference run's state: parameters and AdamW
/// moments within 1e-4 relative, the same update count.
void check_state(const fs::path& dir, const reference_run& ref, std::uint64_t step) {
  const auto job = apps::parse_job(default_job_text(), "job");
  const auto m = runtime::read_checkpoint(dir, apps::trajectory_hash(job), job.model.num_layers());
  CHECK(m.step == step);
  for (int l = 0; l < job.model.num_layers(); ++l) {
    CAPTURE(l);
    const planning::layer_index layer{l};
    const auto got = actors::decode_layer_state(job.model, layer, runtime::read_layer_file(dir, runtime::file_of(m, l)));
    const auto want = actors::decode_layer_state(job.model, layer, ref.layers.at(static_cast<std::size_t>(l)));
    CHECK(got.step == static_cast<std::int64_t>(step));
    CHECK(got.step == want.step);
    CHECK(relative_difference(got.parameters, want.parameters) <= 1e-4);
    CHECK(relative_difference(got.exp_avg, want.exp_avg) <= 1e-4);
    CHECK(relative_difference(got.exp_avg_sq, want.exp_avg_sq) <= 1e-4);
  }
}

/// The nodes of the first epoch's first pipeline, as the coordinator plans the job.
std::vector<int> first_pipeline(const std::string& text, int nodes) {
  const auto job = apps::parse_job(text, "job");
  const auto profile = apps::modelled_profile(job);
  const auto cfg = apps::planner_job(job, nodes, job.cluster.fault_tolerance);
  const auto plan = planning::plan_job(profile, cfg);
  REQUIRE(plan.pipelines.size() == 2);
  // Losing all of it leaves fewer than (f+1)·n0 nodes, and the other pipeline holds every layer.
  REQUIRE(nodes - static_cast<int>(plan.pipelines[0].nodes.size()) < 2 * plan.spec.n0);
  const planning::layer_costs costs(profile, planning::job_memory(profile, cfg));
  const planning::reconfiguration_context ctx{plan.templates, costs, cfg.fault_tolerance,
                                              cfg.global_batch / cfg.microbatch, cfg.microbatch};
  const auto r = planning::reconfigure(ctx, {plan.pipelines, plan.idle_nodes}, plan.pipelines[0].nodes, {});
  REQUIRE(r.action == planning::reconfiguration_action::checkpoint_and_stop);
  std::vector<int> out;  // worker numbers, as --fail-at takes them
  for (auto n : plan.pipelines[0].nodes) out.push_back(static_cast<int>(n.value));
  return out;
}

std::string line_with(const std::string& output, const std::string& text) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find(text) != std::string::npos) return line;
  return "";
}

}  // namespace

TEST_CASE("checkpoint e2e: a whole pipeline lost with --exit-below-minimum: the survivors checkpoint, exit 4, and a resume on 4 nodes continues") {
  constexpr int steps = 7;
  const auto ref = reference(steps);
  scratch s;
  const auto victims = first_pipeline(job_text(6), 6);
  const auto root = s.dir / "ckpt";
  const auto first = run_local(s.dir, job_text(6), steps, {"--checkpoint-dir", root.string(), "--exit-below-minimum"},
                               [&](running_local& local) {
    std::vector<pid_t> pids;
    for (int v : victims) pids.push_back(local.worker_pid(v, std::chrono::seconds(60)));
    local.wait_for({.kind = event_kind::step_committed, .step = 1}, std::chrono::seconds(150));
    for (pid_t p : pids) REQUIRE(::kill(p, SIGKILL) == 0);
  });
  INFO("output of the first run:\n" << first.output);
  INFO("events of the first run:\n" << describe(first.events));
  REQUIRE(first.status == apps::exit_checkpoint_and_stop);
  REQUIRE(first.records.size() == 1);
  const auto& stop = first.records[0];
  CHECK(stop["event"] == "checkpoint_and_stop");
  CHECK(stop["reason"].get<std::string>().find("cannot continue after losing node(s)") != std::string::npos);
  REQUIRE(stop["dir"].is_string());
  const fs::path dir = stop["dir"].get<std::string>();
  const auto step = stop["step"].get<int>();
  CHECK(step >= 2);
  CHECK(step < steps);
  CHECK(dir == root / runtime::checkpoint_dir_name(static_cast<std::uint64_t>(step)));
  // Steps 0..step-1 committed, on the failure-free trajectory; the checkpoint is their state,
  // written (published) before the job stopped with that outcome.
  check_losses(first, ref, 0, step);
  const auto written = position(first.events, {.kind = event_kind::checkpoint_written,
                                               .step = static_cast<std::uint64_t>(step), .detail = dir.string()});
  CHECK(written < position(first.events, {.kind = event_kind::stopped, .outcome = stop_outcome::checkpoint_and_stop,
                                          .committed = static_cast<std::uint64_t>(step)}));
  // What the user is told on purpose: this program's own command that resumes it.
  const auto resume_line = line_with(first.output, "resume with: ");
  CHECK(resume_line.find("oobleck-local ") != std::string::npos);
  CHECK(resume_line.find("--resume " + dir.string()) != std::string::npos);
  CHECK(runtime::list_checkpoints(root) == std::vector<fs::path>{dir});
  for (const auto& e : fs::directory_iterator(root)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);

  // Resume on 4 nodes (another node count, the same trajectory), with a checkpoint at the end.
  const auto root2 = s.dir / "ckpt2";
  const auto second = run_local(s.dir, job_text(4), steps,
                                {"--resume", dir.string(), "--checkpoint-dir", root2.string(), "--checkpoint-every",
                                 std::to_string(steps)});
  INFO("output of the resumed run:\n" << second.output);
  INFO("events of the resumed run:\n" << describe(second.events));
  REQUIRE(second.status == 0);
  // It trained from the checkpoint's step on: its first epoch runs that step, and it committed the
  // rest (and only the rest).
  CHECK(contains(second.events, {.kind = event_kind::epoch_formed, .epoch = 1, .step = static_cast<std::uint64_t>(step)}));
  CHECK(contains(second.events, finished(static_cast<std::uint64_t>(steps - step))));
  check_losses(second, ref, step, steps);
  check_state(root2 / runtime::checkpoint_dir_name(steps), ref, steps);
}

TEST_CASE("checkpoint e2e: periodic checkpoints hold the committed state, and a torn one is refused at resume") {
  constexpr int steps = 4;
  const auto ref = reference(steps);
  scratch s;
  const auto root = s.dir / "ckpt";
  const auto r = run_local(s.dir, job_text(4), steps, {"--checkpoint-dir", root.string(), "--checkpoint-every", "2"});
  INFO("output:\n" << r.output);
  INFO("events:\n" << describe(r.events));
  REQUIRE(r.status == 0);
  CHECK(r.records.empty());
  check_losses(r, ref, 0, steps);
  REQUIRE(runtime::list_checkpoints(root) ==
          std::vector<fs::path>{root / runtime::checkpoint_dir_name(2), root / runtime::checkpoint_dir_name(4)});
  const auto written = all_of(r.events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == 2u);
  CHECK(event_match{.step = 2, .detail = (root / runtime::checkpoint_dir_name(2)).string()}(written[0]));
  CHECK(event_match{.step = 4, .detail = (root / runtime::checkpoint_dir_name(4)).string()}(written[1]));
  check_state(root / runtime::checkpoint_dir_name(4), ref, 4);

  // A truncated layer file: refused before anything trains, naming the file.
  const auto torn = s.dir / "torn";
  fs::copy(root / runtime::checkpoint_dir_name(2), torn);
  const auto file = torn / runtime::layer_file_name(3);
  fs::resize_file(file, fs::file_size(file) / 2);
  const auto refused = run_local(s.dir, job_text(4), steps, {"--resume", torn.string()});
  INFO("output of the refused resume:\n" << refused.output);
  CHECK(refused.status == 2);
  // What the user is told on purpose: the error names the file and what is wrong with it.
  CHECK(refused.output.find(file.string()) != std::string::npos);
  CHECK(refused.output.find("truncated") != std::string::npos);
  CHECK(refused.steps.empty());
  CHECK(!contains(refused.events, {.kind = event_kind::step_committed}));  // nothing trained

  // A checkpoint of another job (another model seed): refused as well.
  std::string other = job_text(4);
  const auto seed = other.find("seed = 1234");
  REQUIRE(seed != std::string::npos);
  other.replace(seed, 11, "seed = 4321");
  const auto foreign = run_local(s.dir, other, steps, {"--resume", (root / runtime::checkpoint_dir_name(2)).string()});
  INFO("output of the foreign resume:\n" << foreign.output);
  CHECK(foreign.status == 2);
  CHECK(foreign.output.find("a checkpoint of another job") != std::string::npos);  // the user's error
  CHECK(foreign.steps.empty());
  CHECK(!contains(foreign.events, {.kind = event_kind::step_committed}));
}

TEST_CASE("checkpoint e2e: SIGTERM checkpoints before it stops, a writer killed mid-write is replaced, and the resume continues") {
  constexpr int steps = 30;  // far more than pass between step 1's commit and the SIGTERM's arrival
  const auto ref = reference(steps);
  scratch s;
  const auto root = s.dir / "ckpt";
  // The first worker to write a layer file writes half of it and SIGKILLs itself (once: the marker).
  const auto marker = s.dir / "writer-died";
  REQUIRE(::setenv("OOBLECK_TEST_DIE_WRITING_CHECKPOINT", marker.c_str(), 1) == 0);
  const auto first = run_local(s.dir, job_text(6), steps, {"--checkpoint-dir", root.string()}, [&](running_local& local) {
    local.wait_for({.kind = event_kind::step_committed, .step = 1}, std::chrono::seconds(150));
    local.process.signal(SIGTERM);
  });
  ::unsetenv("OOBLECK_TEST_DIE_WRITING_CHECKPOINT");
  INFO("output of the first run:\n" << first.output);
  INFO("events of the first run:\n" << describe(first.events));
  REQUIRE(first.status == 0);  // a shutdown
  // A writer died while writing (its node was lost after the stop was asked for), and the
  // checkpoint was still written, then the job stopped as a shutdown naming it.
  REQUIRE(fs::exists(marker));
  const auto written = all_of(first.events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == 1u);
  const fs::path dir = written[0].detail;
  const auto step = static_cast<int>(written[0].step);
  CHECK(step >= 2);
  REQUIRE(step < steps);
  CHECK(dir == root / runtime::checkpoint_dir_name(static_cast<std::uint64_t>(step)));
  CHECK(position(first.events, {.kind = event_kind::node_lost}) < position(first.events, {.kind = event_kind::checkpoint_written}));
  const auto stopped = position(first.events, {.kind = event_kind::stopped, .outcome = stop_outcome::shutdown});
  REQUIRE(stopped < first.events.size());
  CHECK(position(first.events, {.kind = event_kind::checkpoint_written}) < stopped);
  CHECK(first.events[stopped].detail.find(dir.string()) != std::string::npos);
  check_losses(first, ref, 0, step);
  // Whole and valid; the dead writer's half file is not in it.
  const auto job = apps::parse_job(default_job_text(), "job");
  CHECK_NOTHROW(runtime::read_checkpoint(dir, apps::trajectory_hash(job), job.model.num_layers()));
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    CHECK(e.path().extension() != ".tmp");
    ++entries;
  }
  CHECK(entries == static_cast<std::size_t>(job.model.num_layers()) + 2);  // the manifest and model.toml
  CHECK(runtime::list_checkpoints(root) == std::vector<fs::path>{dir});

  // Resumed on 4 nodes: the failure-free run's losses.
  const auto second = run_local(s.dir, job_text(4), steps, {"--resume", dir.string()});
  INFO("output of the resumed run:\n" << second.output);
  INFO("events of the resumed run:\n" << describe(second.events));
  REQUIRE(second.status == 0);
  CHECK(contains(second.events, {.kind = event_kind::epoch_formed, .epoch = 1, .step = static_cast<std::uint64_t>(step)}));
  check_losses(second, ref, step, steps);
}
