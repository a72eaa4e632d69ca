// Stopping with a checkpoint, end to end (issue 23): oobleck-coordinator and its workers as
// processes on loopback. `oobleck-ctl shutdown --checkpoint` and SIGTERM to oobleck-coordinator
// write a checkpoint of the last committed step before the job stops (outcome shutdown, the stop
// naming it); a plain shutdown writes none. (SIGTERM through oobleck-local, with a writer killed mid-write, and the resume, are
// in checkpoint_e2e_test.cpp; the failed outcome and the writers' errors and deadlines in
// reconfiguration_checkpoint_test.cpp.) What the coordinator did comes from its events; every wait
// has a deadline.

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

#include "runtime/checkpoint.hpp"
#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/subprocess.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;
using messages::stop_outcome;
namespace fs = std::filesystem;

namespace {

/// A scratch directory with the default job on 4 nodes (f = 1, n0 = 2: two pipelines of two).
struct job_dir {
  fs::path dir;
  job_dir() {
    static int n = 0;
    dir = fs::temp_directory_path() / ("oobleck-ckpt-stop-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const auto r = run_process(bin + "/oobleck-local", {"--print-default-job"});
    REQUIRE(r.exit_status == 0);
    std::string text = r.out;
    const auto at = text.find("\nnodes = ");
    REQUIRE(at != std::string::npos);
    text.replace(at + 1, text.find('\n', at + 1) - at - 1, "nodes = 4");
    std::ofstream(dir / "job.toml") << text;
  }
  ~job_dir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

/// The coordinator (a job of many steps, checkpoints under ckpt/ when `checkpoints`) and 4 workers,
/// once step 1 has committed.
struct running_job {
  const job_dir& d;
  std::unique_ptr<background_process> coordinator;
  std::vector<std::unique_ptr<background_process>> workers;
  std::string address;
  std::string events;
  running_job(const job_dir& dir, bool checkpoints) : d(dir), events(dir.path("events.jsonl")) {
    std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", d.path("job.toml"), "--token-file",
                                  d.path("token"), "--steps", "1000", "--events-out", events, "--address-file",
                                  d.path("address")};
    if (checkpoints) args.insert(args.end(), {"--checkpoint-dir", d.path("ckpt")});
    coordinator = std::make_unique<background_process>(bin + "/oobleck-coordinator", args);
    address = wait_for_address(d.path("address"));
    for (int i = 0; i < 4; ++i)
      workers.push_back(std::make_unique<background_process>(
          bin + "/oobleck-worker", std::vector<std::string>{"--coordinator", address, "--token-file", d.path("token"),
                                                            "--name", "w" + std::to_string(i), "--connect-timeout", "20"}));
    wait_for_event(events, {.kind = event_kind::step_committed, .step = 1}, std::chrono::seconds(120));
  }
  process_result ctl(const std::vector<std::string>& command) const {
    std::vector<std::string> args{"--coordinator", address, "--token-file", d.path("token")};
    args.insert(args.end(), command.begin(), command.end());
    return run_process(bin + "/oobleck-ctl", args);
  }
};

}  // namespace

TEST_CASE("checkpoint stop e2e: oobleck-ctl shutdown --checkpoint writes a checkpoint, then the job stops") {
  job_dir d;
  running_job job(d, true);
  const auto r = job.ctl({"shutdown", "--checkpoint", "--reason", "maintenance"});
  INFO("ctl: " << r.out << r.err);
  CHECK(r.exit_status == 0);
  CHECK(r.out.find("shutting down after a checkpoint") != std::string::npos);
  const auto stop = wait_for_event(job.events, {.kind = event_kind::stopped}, std::chrono::seconds(120));
  CHECK(job.coordinator->wait_exit(std::chrono::seconds(60)) == 0);
  const auto events = read_event_file(job.events);
  INFO("coordinator:\n" << job.coordinator->output());
  INFO("events:\n" << describe(events));
  CHECK(stop.outcome == stop_outcome::shutdown);
  const auto written = all_of(events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == 1u);
  const fs::path dir = written[0].detail;
  CHECK(dir == fs::path(d.path("ckpt")) / runtime::checkpoint_dir_name(written[0].step));
  CHECK(written[0].step == stop.step);  // the last committed state
  CHECK(stop.committed == stop.step);
  CHECK(position(events, {.kind = event_kind::checkpoint_written}) < position(events, {.kind = event_kind::stopped}));
  CHECK(stop.detail.find("maintenance") != std::string::npos);
  CHECK(stop.detail.find(dir.string()) != std::string::npos);
  // Complete and valid: every layer's file, sizes and checksums as the manifest says.
  const auto m = runtime::read_manifest(dir);
  CHECK(m.step == written[0].step);
  CHECK_NOTHROW(runtime::read_checkpoint(dir, m.job_hash, m.num_layers));
  for (auto& w : job.workers) CHECK(w->wait_exit(std::chrono::seconds(30)) == 0);
}

TEST_CASE("checkpoint stop e2e: a plain shutdown writes no checkpoint, and --checkpoint without a folder says why") {
  job_dir d;
  {
    running_job job(d, true);
    CHECK(job.ctl({"shutdown"}).exit_status == 0);
    const auto stop = wait_for_event(job.events, {.kind = event_kind::stopped}, std::chrono::seconds(60));
    CHECK(stop.outcome == stop_outcome::shutdown);
    CHECK(job.coordinator->wait_exit(std::chrono::seconds(60)) == 0);
    CHECK(!contains(read_event_file(job.events), {.kind = event_kind::checkpoint_written}));
    CHECK(runtime::list_checkpoints(d.path("ckpt")).empty());
  }
  fs::remove(d.path("events.jsonl"));
  fs::remove(d.path("address"));
  running_job job(d, false);
  CHECK(job.ctl({"shutdown", "--checkpoint"}).exit_status == 0);
  const auto stop = wait_for_event(job.events, {.kind = event_kind::stopped}, std::chrono::seconds(60));
  CHECK(stop.outcome == stop_outcome::shutdown);
  CHECK(job.coordinator->wait_exit(std::chrono::seconds(60)) == 0);
  CHECK(!contains(read_event_file(job.events), {.kind = event_kind::checkpoint_written}));
  // What the operator is told on purpose: why no checkpoint was written.
  CHECK(job.coordinator->output().find("no checkpoint written before stopping: no checkpoint directory is configured") !=
        std::string::npos);
}

TEST_CASE("checkpoint stop e2e: SIGTERM to oobleck-coordinator writes a checkpoint, then the job stops") {
  job_dir d;
  running_job job(d, true);
  job.coordinator->signal(SIGTERM);
  const auto stop = wait_for_event(job.events, {.kind = event_kind::stopped}, std::chrono::seconds(120));
  CHECK(job.coordinator->wait_exit(std::chrono::seconds(60)) == 0);
  const auto events = read_event_file(job.events);
  INFO("coordinator:\n" << job.coordinator->output());
  INFO("events:\n" << describe(events));
  CHECK(stop.outcome == stop_outcome::shutdown);
  const auto written = all_of(events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == 1u);
  CHECK(written[0].step == stop.step);
  const fs::path dir = written[0].detail;
  CHECK(stop.detail.find(dir.string()) != std::string::npos);
  const auto m = runtime::read_manifest(dir);
  CHECK_NOTHROW(runtime::read_checkpoint(dir, m.job_hash, m.num_layers));
  for (auto& w : job.workers) CHECK(w->wait_exit(std::chrono::seconds(30)) == 0);
}
