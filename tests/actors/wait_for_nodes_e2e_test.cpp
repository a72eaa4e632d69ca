// Below the minimum, the job waits for nodes and resumes by itself (issue 25 item 6, ARCHITECTURE.md
// §10 "Waiting for nodes"): oobleck-local kills a whole pipeline at once (beyond f), so fewer than
// (f + 1) x n0 nodes remain and the reconfiguration policy says "checkpoint and stop". The
// coordinator does not exit: it reports `waiting` (a waiting_for_nodes event and metrics record),
// admits the workers started once it waits (--join-at waiting:K), and resumes at the committed
// step, from the survivors' memory when every layer kept a holder, else from a checkpoint. Every
// step's loss is the failure-free run's (within 1e-4), on B samples, with every layer's holders in
// agreement.

#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/recovery_e2e_support.hpp"
#include "support/job_events.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

const nlohmann::json* record(const run_result& r, const std::string& event) {
  for (const auto& rec : r.records)
    if (rec.value("event", "") == event) return &rec;
  return nullptr;
}

/// Every step of 0..steps-1 committed, each on the failure-free trajectory (B samples, holders in
/// agreement, the one-process loss within 1e-4); a step in `again` may have committed twice (the
/// steps after the checkpoint a resume went back to), every other step once.
void check_steps(const job_case& c, const run_result& r, int steps, const std::set<int>& again) {
  std::map<int, int> seen;
  for (const auto& m : r.steps) {
    const int k = m["step"].get<int>();
    CAPTURE(k);
    ++seen[k];
    CHECK(m["samples"] == c.job.training.global_batch);
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    const double want = reference_losses(steps)[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    CHECK(seen[k] >= 1);
    CHECK(seen[k] <= (again.count(k) ? 2 : 1));
  }
}

/// The step of a checkpoint directory (".../step-00000002" is 2); -1 for another name.
int checkpoint_step(const std::string& dir) {
  const auto name = std::filesystem::path(dir).filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  return std::stoi(name.substr(5));
}

std::string ids(const std::vector<int>& nodes) {
  std::string out;
  for (int n : nodes) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

}  // namespace

TEST_CASE("wait for nodes e2e: a whole pipeline lost at once: the job waits, nodes join, it resumes from memory") {
  // Four nodes, f = 1, two pipelines: both nodes of one die in step 3. The other pipeline holds
  // every layer: once two workers have joined, training goes on from the survivors' memory at
  // step 3 (no checkpoint folder: nothing could be read from disk).
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 10;
  const planner_model model(c);
  const auto first = model.initial();
  REQUIRE(first.pipelines.size() == 2u);
  std::vector<int> victims;
  for (auto n : first.pipelines[0].nodes) victims.push_back(static_cast<int>(n.value));
  REQUIRE(victims.size() == 2u);
  const auto r = run_local(c, steps, {"--fail-at", "3:" + ids(victims), "--wait-for-nodes", "120", "--join-at", "waiting:2"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  // It waited (an event and a record, with the counts), then resumed from memory at step 3.
  const auto waiting = all_of(r.events, {.kind = event_kind::waiting_for_nodes});
  REQUIRE(!waiting.empty());
  CHECK(waiting.front().detail.find("need 4") != std::string::npos);
  const auto* wait_rec = record(r, "waiting_for_nodes");
  REQUIRE(wait_rec != nullptr);
  CHECK((*wait_rec)["need"] == 4);
  CHECK((*wait_rec)["have"].get<int>() < 4);
  CHECK((*wait_rec)["step"] == 3);
  const auto* resumed = record(r, "resumed");
  REQUIRE(resumed != nullptr);
  CHECK((*resumed)["source"] == "memory");
  CHECK((*resumed)["step"] == 3);
  CHECK((*resumed)["nodes"] == 4);
  CHECK(position(r.events, {.kind = event_kind::waiting_for_nodes}) <
        position(r.events, {.kind = event_kind::resumed, .step = 3, .detail = "memory"}));
  CHECK(!contains(r.events, {.kind = event_kind::stopped, .outcome = messages::stop_outcome::checkpoint_and_stop}));
  CHECK(r.output.find("resuming from") == std::string::npos);
  // Every step once on the failure-free trajectory; the lost nodes compute nothing after step 2.
  check_trajectory(c, r, steps, {});
  REQUIRE(r.steps.size() == static_cast<std::size_t>(steps));
  for (std::size_t k = 3; k < r.steps.size(); ++k)
    for (const auto& p : r.steps[k]["pipelines"])
      for (const auto& n : p["nodes"]) CHECK(std::count(victims.begin(), victims.end(), n.get<int>()) == 0);
}

TEST_CASE("wait for nodes e2e: a layer without a holder: the job waits and resumes from a checkpoint") {
  // Three of four nodes are killed together once step 2 has committed: a whole pipeline and half
  // of the other, so some layers keep no live holder. Whether the coordinator still wrote a
  // checkpoint of the committed step before the last of them died (they die within microseconds,
  // their losses arrive one by one) or falls back to the periodic one of step 2 (every 2 steps),
  // the survivor's memory cannot continue the job: with a checkpoint folder the job waits, and
  // once three workers joined it resumes from that checkpoint (the steps after it run again, on
  // the same trajectory).
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 10;
  const planner_model model(c);
  const auto first = model.initial();
  REQUIRE(first.pipelines.size() == 2u);
  std::vector<int> victims;
  for (auto n : first.pipelines[0].nodes) victims.push_back(static_cast<int>(n.value));
  victims.push_back(static_cast<int>(first.pipelines[1].nodes.front().value));
  temp_dir dir("oobleck-wait-");
  const std::string root = (dir.path() / "ckpt").string();
  const auto r = run_local(c, steps, {"--checkpoint-dir", root, "--checkpoint-every", "2", "--join-at", "waiting:3"},
                           [&](running_local& run) {
                             std::vector<pid_t> pids;
                             for (int v : victims) pids.push_back(run.worker_pid(v, std::chrono::seconds(60)));
                             run.wait_for({.kind = event_kind::step_committed, .step = 2}, std::chrono::seconds(120));
                             for (pid_t p : pids) REQUIRE(::kill(p, SIGKILL) == 0);
                           });
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto* wait_rec = record(r, "waiting_for_nodes");
  REQUIRE(wait_rec != nullptr);
  CHECK((*wait_rec)["need"] == 4);
  REQUIRE((*wait_rec)["checkpoint"].is_string());
  const int from = checkpoint_step((*wait_rec)["checkpoint"].get<std::string>());
  CHECK(from >= 2);
  const auto* resumed = record(r, "resumed");
  REQUIRE(resumed != nullptr);
  CHECK((*resumed)["source"] == "checkpoint");
  CHECK((*resumed)["step"] == from);
  CHECK(checkpoint_step((*resumed)["checkpoint"].get<std::string>()) == from);
  CHECK(record(r, "checkpoint_and_stop") == nullptr);
  // The steps from the checkpoint to the kill committed before it and again after the resume, on
  // the same trajectory; every other step once.
  std::set<int> again;
  for (int k = from; k < from + 3 && k < steps; ++k) again.insert(k);
  check_steps(c, r, steps, again);
}

TEST_CASE("wait for nodes e2e: --exit-below-minimum and a wait that runs out stop the job as before (status 4)") {
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 8;
  const planner_model model(c);
  const auto first = model.initial();
  REQUIRE(first.pipelines.size() == 2u);
  std::vector<int> victims;
  for (auto n : first.pipelines[0].nodes) victims.push_back(static_cast<int>(n.value));
  for (const std::vector<std::string>& how : {std::vector<std::string>{"--exit-below-minimum"},
                                             std::vector<std::string>{"--wait-for-nodes", "1"}}) {
    CAPTURE(how.front());
    temp_dir dir("oobleck-wait-");
    std::vector<std::string> args{"--fail-at", "3:" + ids(victims), "--checkpoint-dir", (dir.path() / "ckpt").string()};
    args.insert(args.end(), how.begin(), how.end());
    const auto r = run_local(c, steps, args);
    INFO(r.output);
    CHECK(r.status == 4);
    const auto* stop = record(r, "checkpoint_and_stop");
    REQUIRE(stop != nullptr);
    CHECK((*stop)["dir"].is_string());
    CHECK((*stop)["step"] == 3);
    // Only the wait reports waiting; it ran out, saying so.
    CHECK(contains(r.events, {.kind = event_kind::waiting_for_nodes}) == (how.front() == "--wait-for-nodes"));
    if (how.front() == "--wait-for-nodes") CHECK(r.output.find("waited 1 s for nodes") != std::string::npos);
  }
}

TEST_CASE("wait for nodes e2e: nodes lost while the coordinator is frozen leave a layer without a holder: it falls back to the newest checkpoint") {
  // Four nodes, f = 1, two pipelines of two; a checkpoint every 2 steps. The coordinator freezes in
  // step 5 for 4 s; meanwhile the first node of each pipeline dies, so no node that comes back
  // holds the first stage's layers. The coordinator wakes, has every node lost at once, waits for
  // them, and adopts the two that come back: their memory cannot be the job's state, so it falls
  // back to the newest checkpoint (step 4), saying why; with two of four nodes it waits, the two
  // workers started then join, and the job resumes from that checkpoint and finishes.
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 10;
  const planner_model model(c);
  const auto first = model.initial();
  REQUIRE(first.pipelines.size() == 2u);
  REQUIRE(first.pipelines[0].nodes.size() == 2u);
  REQUIRE(first.pipelines[1].nodes.size() == 2u);
  const std::vector<int> victims{static_cast<int>(first.pipelines[0].nodes.front().value),
                                 static_cast<int>(first.pipelines[1].nodes.front().value)};
  temp_dir dir("oobleck-wait-");
  const auto r = run_local(c, steps,
                           {"--hang-coordinator-at", "5:4", "--checkpoint-dir", (dir.path() / "ckpt").string(),
                            "--checkpoint-every", "2", "--join-at", "waiting:2"},
                           [&](running_local& run) {
                             run.wait_for({.kind = event_kind::step_committed, .step = 4}, std::chrono::seconds(120));
                             // Frozen in the middle of step 5 for 4 s: kill the victims within it.
                             std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                             for (int v : victims) {
                               const pid_t pid = run.worker_pid(v);
                               REQUIRE(pid > 0);
                               ::kill(pid, SIGKILL);
                             }
                           });
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("every node was lost at once") != std::string::npos);
  CHECK(r.output.find("falling back to the newest checkpoint") != std::string::npos);
  const auto* wait_rec = record(r, "waiting_for_nodes");
  REQUIRE(wait_rec != nullptr);
  CHECK((*wait_rec)["have"] == 2);
  CHECK((*wait_rec)["need"] == 4);
  const auto* resumed = record(r, "resumed");
  REQUIRE(resumed != nullptr);
  CHECK((*resumed)["source"] == "checkpoint");
  CHECK((*resumed)["step"] == 4);
  CHECK(record(r, "coordinator_restored") != nullptr);
  // Step 4 committed before the freeze and again after the resume, on the same trajectory.
  check_steps(c, r, steps, {4});
}
