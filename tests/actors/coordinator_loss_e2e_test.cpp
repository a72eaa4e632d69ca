// Coordinator loss end to end (issue 25, ARCHITECTURE.md §10 "Coordinator loss"): oobleck-local
// runs a job whose coordinator kills itself (SIGKILL) in the middle of a step, or right after it
// decided a commit that reached one node only. The workers keep their layers and wait; oobleck-local
// starts a replacement at the same address (as systemd or a Slurm step would), which adopts the job
// from the workers' memory: no checkpoint folder exists, so no file can be read to resume. The job
// must finish every step on the failure-free trajectory (losses within 1e-4 of one process, B
// samples a step, every layer's holders in agreement).

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/recovery_e2e_support.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;

namespace {

const nlohmann::json* restored_record(const run_result& r) {
  for (const auto& rec : r.records)
    if (rec.value("event", "") == "coordinator_restored") return &rec;
  return nullptr;
}

/// Every step but `missing` (its record died with the coordinator that decided it) committed once,
/// on B samples, with every layer's holders in agreement and the failure-free run's loss: had any
/// node not applied step `missing` (or applied it twice), the digests or the losses after it would
/// differ.
void check_all_steps_but(const job_case& c, const run_result& r, int steps, int missing) {
  std::set<int> seen;
  for (const auto& m : r.steps) {
    const int k = m["step"].get<int>();
    CAPTURE(k);
    CHECK(seen.insert(k).second);
    CHECK(m["samples"] == c.job.training.global_batch);
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    const double want = reference_losses(steps)[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
  for (int k = 0; k < steps; ++k)
    if (k != missing) CHECK(seen.count(k) == 1u);
}

}  // namespace

TEST_CASE("coordinator loss e2e: kill -9 in the middle of a step with no checkpoint folder: a replacement adopts the job") {
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 12;
  const auto r = run_local(c, steps, {"--kill-coordinator-at", "5"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("the coordinator kills itself (SIGKILL) in the middle of step 5") != std::string::npos);
  CHECK(r.output.find("starting a replacement") != std::string::npos);
  CHECK(r.output.find("adopted the job (term 2)") != std::string::npos);
  // Every step once, in order, on the failure-free trajectory; every holder of a layer agrees.
  check_trajectory(c, r, steps, {});
  const auto* rec = restored_record(r);
  REQUIRE(rec != nullptr);
  CHECK((*rec)["term"] == 2);
  CHECK((*rec)["step"] == 5);
  CHECK((*rec)["nodes"] == 4);
  CHECK((*rec)["downtime_ms"].get<double>() > 0);
  // Nothing was read from disk: the job has no checkpoint folder, and the replacement said where
  // its state came from.
  CHECK(r.output.find("resuming from") == std::string::npos);
}

TEST_CASE("coordinator loss e2e: killed right after deciding a commit that reached one node: the replacement completes it") {
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 12;
  const auto r = run_local(c, steps, {"--kill-coordinator-at", "5:commit"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("step 5's commit sent to") != std::string::npos);
  // The node that applied step 5 came back at step 5; the others applied it from their gradients.
  CHECK(r.output.find("apply it now from the gradients they kept") != std::string::npos);
  const auto* rec = restored_record(r);
  REQUIRE(rec != nullptr);
  CHECK((*rec)["step"] == 6);
  CHECK((*rec)["completed"] == 3);
  // Step 5's loss died with the coordinator (its record was never written).
  check_all_steps_but(c, r, steps, 5);
}

TEST_CASE("coordinator loss e2e: frozen beyond the timeout with no replacement: the workers wait and it adopts them back") {
  // The coordinator freezes (SIGSTOP) for 4 s in the middle of step 5, past the 1.5 s connection
  // timeout: every worker loses it, keeps its state and keeps trying its address; when it wakes it
  // finds every node lost at once, waits for them instead of stopping, and adopts them back.
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 12;
  const auto r = run_local(c, steps, {"--hang-coordinator-at", "5:4"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("every node was lost at once") != std::string::npos);
  CHECK(r.output.find("starting a replacement") == std::string::npos);  // it never died
  check_trajectory(c, r, steps, {});
  const auto* rec = restored_record(r);
  REQUIRE(rec != nullptr);
  CHECK((*rec)["step"] == 5);
  CHECK((*rec)["nodes"] == 4);
  CHECK((*rec)["downtime_ms"].get<double>() >= 3000);  // at least the freeze
}

TEST_CASE("coordinator loss e2e: a worker lost while the coordinator is frozen is a normal loss for it") {
  // Six nodes, f = 1: node 5 is killed while the coordinator is frozen; the coordinator adopts the
  // five that come back, and the one that does not is lost (the reconfiguration policy's usual
  // path), with the trajectory unchanged.
  const auto c = make_job(6, 1, 1'500'000);
  const int steps = 12;
  const auto r = run_local(c, steps, {"--hang-coordinator-at", "5:4", "--coordinator-grace", "30"},
                           [](running_local& run) {
                             run.wait_for({.kind = messages::event_kind::step_committed, .step = 4});
                             // Frozen in the middle of step 5 for 4 s: kill node 5 within it.
                             std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                             const pid_t victim = run.worker_pid(5);
                             REQUIRE(victim > 0);
                             ::kill(victim, SIGKILL);
                           });
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("1 not back") != std::string::npos);
  const auto* rec = restored_record(r);
  REQUIRE(rec != nullptr);
  CHECK((*rec)["nodes"] == 5);
  // The lost node computes nothing after the adoption: it is not in a pipeline of step 5 or later.
  REQUIRE(r.steps.size() == static_cast<std::size_t>(steps));
  for (std::size_t k = 5; k < r.steps.size(); ++k)
    for (const auto& p : r.steps[k]["pipelines"])
      for (const auto& n : p["nodes"]) CHECK(n.get<int>() != 5);
  check_trajectory(c, r, steps, {});
}

TEST_CASE("coordinator loss e2e: frozen then replaced by a standby then woken: it exits 5 and changes nothing") {
  // Coordinator A freezes for 10 s (time for every worker to reach B on a loaded machine) in the middle of step 5; a standby B (same job and token) waits
  // at a second address; the workers know both (--coordinator A,B), go to B, which adopts the job;
  // when A wakes, a worker tells it it was replaced (term 2 > 1): it exits with status 5 and writes
  // no step. B trains on the failure-free trajectory until the test stops it (SIGTERM, an orderly
  // shutdown) once A has exited: the workers must still run when A wakes, however fast the steps
  // are (a fixed 1,000 steps once ended before A woke, A then waited in vain: the test failed).
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 1'000'000;  // more than B can train before the test stops it
  const int checked = 20;  // the trajectory against one process (each step is still checked once)
  const testing::temp_dir tmp("oobleck-standby-");
  const auto& dir = tmp.path();
  write_job(c, dir);
  const auto job = (dir / "job.toml").string();
  const auto token = (dir / "token").string();
  auto coordinator = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", job, "--token-file", token, "--steps",
                                  std::to_string(steps), "--metrics-out", (dir / (name + ".metrics")).string(),
                                  "--events-out", (dir / (name + ".events")).string(), "--address-file",
                                  (dir / (name + ".address")).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<background_process>(bin + "/oobleck-coordinator", args);
  };
  auto a = coordinator("a", {"--hang-self-at", "5:10"});
  const auto address_a = wait_for_address((dir / "a.address").string());
  auto b = coordinator("b", {});
  const auto address_b = wait_for_address((dir / "b.address").string());
  std::vector<std::unique_ptr<background_process>> workers;
  for (int i = 0; i < 4; ++i)
    workers.push_back(std::make_unique<background_process>(
        bin + "/oobleck-worker", std::vector<std::string>{"--coordinator", address_a + "," + address_b, "--token-file",
                                                          token, "--name", "node" + std::to_string(i)}));
  auto everyone = [&] {
    std::string all = "--- coordinator A:\n" + a->output() + "--- coordinator B:\n" + b->output();
    for (std::size_t i = 0; i < workers.size(); ++i)
      all += "--- worker " + std::to_string(i) + ":\n" + workers[i]->output();
    return all;
  };
  int status_b = -1, status_a = -1;
  try {
    status_a = a->wait_exit(std::chrono::seconds(120));
    b->signal(SIGTERM);
    status_b = b->wait_exit(std::chrono::seconds(60));
  } catch (const std::exception& e) {
    FAIL(e.what() << "\n" << everyone());
  }
  std::string output = a->output() + b->output();
  for (auto& w : workers) {
    CHECK(w->wait_exit(std::chrono::seconds(30)) == 0);
    output += w->output();
  }
  INFO(output);
  CHECK(status_b == 0);
  CHECK(status_a == 5);
  run_result ra, rb;
  read_metrics((dir / "a.metrics").string(), ra);
  read_metrics((dir / "b.metrics").string(), rb);
  // A committed steps 0-4 and nothing after it woke; B the rest, after adopting the job.
  REQUIRE(ra.steps.size() == 5u);
  const auto* rec = restored_record(rb);
  REQUIRE(rec != nullptr);
  CHECK((*rec)["term"] == 2);
  CHECK(output.find("it was replaced: stopping: replaced") != std::string::npos);
  run_result all = rb;
  all.steps.insert(all.steps.begin(), ra.steps.begin(), ra.steps.end());
  // Every step once and in order, up to where B was stopped.
  REQUIRE(all.steps.size() >= static_cast<std::size_t>(checked));
  for (std::size_t k = 0; k < all.steps.size(); ++k) CHECK(all.steps[k]["step"] == k);
  all.steps.resize(checked);
  reference_losses(checked);  // the failure-free run, this far
  check_trajectory(c, all, checked, {});
}

TEST_CASE("coordinator loss e2e: two coordinator kills and a worker loss within f in one run") {
  // Six nodes, f = 1: the first coordinator dies in the middle of step 3, its replacement right
  // after deciding step 9's commit (one node told), and between them the test kills node 4's
  // worker after step 6 committed (a loss the second coordinator handles as any loss). The job
  // finishes on the failure-free trajectory with the worker gone from every pipeline after it.
  const auto c = make_job(6, 1, 1'500'000);
  const int steps = 16;
  const auto r = run_local(c, steps, {"--kill-coordinator-at", "3", "--kill-coordinator-at", "9:commit"},
                           [](running_local& run) {
                             run.wait_for({.kind = messages::event_kind::step_committed, .step = 6}, std::chrono::seconds(60));
                             const pid_t victim = run.worker_pid(4);
                             REQUIRE(victim > 0);
                             ::kill(victim, SIGKILL);
                           });
  INFO(r.output);
  REQUIRE(r.status == 0);
  int restored = 0;
  for (const auto& rec : r.records) restored += rec.value("event", "") == "coordinator_restored";
  CHECK(restored == 2);
  CHECK(r.output.find("adopted the job (term 3)") != std::string::npos);
  // Step 9's record died with the second coordinator.
  check_all_steps_but(c, r, steps, 9);
  for (const auto& m : r.steps)
    if (m["step"].get<int>() >= 8)
      for (const auto& p : m["pipelines"])
        for (const auto& n : p["nodes"]) CHECK(n.get<int>() != 4);
}
