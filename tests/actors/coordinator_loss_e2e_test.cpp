// Coordinator loss end to end (issue 25, ARCHITECTURE.md §10 "Coordinator loss"): oobleck-local
// runs a job whose coordinator kills itself (SIGKILL) in the middle of a step, or right after it
// decided a commit that reached one node only. The workers keep their layers and wait; oobleck-local
// starts a replacement at the same address (as systemd or a Slurm step would), which adopts the job
// from the workers' memory: no checkpoint folder exists, so no file can be read to resume. The job
// must finish every step on the failure-free trajectory (losses within 1e-4 of one process, B
// samples a step, every layer's holders in agreement).

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include "actors/recovery_e2e_support.hpp"

using namespace oobleck;
using namespace oobleck::testing;

namespace {

const nlohmann::json* restored_record(const run_result& r) {
  for (const auto& rec : r.records)
    if (rec.value("event", "") == "coordinator_restored") return &rec;
  return nullptr;
}

}  // namespace

TEST_CASE("coordinator loss e2e: kill -9 in the middle of a step, no checkpoint folder: a replacement adopts the job") {
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
  // Step 5's loss died with the coordinator (its record was never written); every other step is
  // there, once, on the failure-free trajectory, and after step 5 every layer's holders agree: had
  // any node not applied step 5 (or applied it twice), the digests or the losses would differ.
  std::set<int> seen;
  for (const auto& m : r.steps) {
    const int k = m["step"].get<int>();
    CAPTURE(k);
    CHECK(seen.insert(k).second);
    CHECK(m["samples"] == c.job.training.global_batch);
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    const double want = reference_losses()[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
  for (int k = 0; k < steps; ++k)
    if (k != 5) CHECK(seen.count(k) == 1u);
}
