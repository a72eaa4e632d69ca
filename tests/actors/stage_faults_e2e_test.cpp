// Stage faults end to end (ARCHITECTURE.md §5 "Stage faults"; checks: recovery_e2e_support.hpp): a
// real stage that throws (--error-at: a c10::Error, "injected: out of memory") once, or in every
// attempt of its step (evicted after [faults] evict_after attempts); a stage that busy-loops in its
// compute while its process stays responsive (--stall-at: named by the step deadline's probe,
// evicted when it stalls again); a worker that hits its memory limit during training (its BLAS
// spins or its allocation throws: the deadline or the strikes find it). Each run ends with every
// step committed once and the loss curve of the failure-free single-process run.

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/recovery_e2e_support.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

/// Deadlines a test can wait for: a stall is named within about a second of its step's start.
const job_keys quick_deadlines{{"faults", "step_deadline_min_ms", "1500"},
                               {"faults", "first_step_deadline_ms", "6000"},
                               {"faults", "form_deadline_ms", "4000"}};

job_keys with(job_keys a, const job_keys& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The step_failed events that name `node`.
std::size_t failures_of(const run_result& r, int node) {
  return count(r.events, {.kind = event_kind::step_failed, .node = node});
}

/// The node lost by eviction, if any: its node_lost event's detail says so.
bool evicted(const run_result& r, int node) {
  for (const auto& e : all_of(r.events, {.kind = event_kind::node_lost, .node = node}))
    if (e.detail.rfind("evicted: ", 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("stage faults e2e: a stage that throws once: the epoch is aborted at once, the step runs again, nothing lost") {
  const auto c = make_job(6, 1, 1'500'000);
  constexpr int steps = 7, victim = 2;
  const auto r = run_local(c, steps, {"--error-at", "3:" + std::to_string(victim) + "/1"});
  INFO(describe(r.events));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto s = check_run(c, r, steps, {});
  CHECK(s.lost.empty());
  // The failure is the node's own, named in the event; the step runs again in a new epoch on the
  // same nodes and commits once.
  CHECK(failures_of(r, victim) == 1u);
  REQUIRE(position(r.events, {.kind = event_kind::step_failed, .step = 3, .node = victim}) < r.events.size());
  // The epoch formed again after the step failed: the node's own report and a peer's failed
  // receive race to the coordinator (CI saw the peer's first, the report during the new forming).
  const auto failed = position(r.events, {.kind = event_kind::step_failed, .step = 3});
  const auto again = position(r.events, {.kind = event_kind::epoch_forming, .step = 3}, failed);
  REQUIRE(again < r.events.size());
  CHECK(r.events[again].lost.empty());
  CHECK(count(r.events, {.kind = event_kind::step_committed, .step = 3}) == 1u);
  // Its peers did not wait for it: the data plane was aborted when it threw (the whole recovery,
  // from the last commit to the next, takes a few steps' time, not a deadline's).
  REQUIRE(r.records.size() == 1);
  CHECK(r.records[0]["downtime_ms"].get<double>() < 5'000);
  CHECK(r.output.find("injected: out of memory") != std::string::npos);
}

TEST_CASE("stage faults e2e: a stage that throws in every attempt is evicted after three, and the job goes on") {
  const auto c = make_job(6, 1, 1'500'000);
  constexpr int steps = 7, victim = 2;
  const auto r = run_local(c, steps, {"--error-at", "3:" + std::to_string(victim)});
  INFO(describe(r.events));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto s = check_run(c, r, steps, {victim});
  CHECK(s.lost == std::set<int>{victim});
  CHECK(failures_of(r, victim) == 3u);  // evict_after = 3 (the default)
  CHECK(evicted(r, victim));
  CHECK(r.output.find("evicted by the coordinator") != std::string::npos);
  CHECK(count(r.events, {.kind = event_kind::step_committed, .step = 3}) == 1u);
}

TEST_CASE("stage faults e2e: a stage that stalls in its compute is named by the step deadline and evicted when it stalls again") {
  const auto c = make_job(6, 1, 1'500'000, with(chaos_heartbeats, quick_deadlines));
  constexpr int steps = 7, victim = 4;
  const auto r = run_local(c, steps, {"--stall-at", "3:" + std::to_string(victim)});
  INFO(describe(r.events));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto s = check_run(c, r, steps, {victim});
  CHECK(s.lost == std::set<int>{victim});
  // Its heartbeats went on (the process answered): no loss by timeout; the deadline's probe named
  // it twice (evict_after_stalls = 2), then it was evicted.
  CHECK(failures_of(r, victim) == 2u);
  CHECK(evicted(r, victim));
  for (const auto& e : all_of(r.events, {.kind = event_kind::step_failed, .node = victim}))
    CHECK(e.detail.find("has been computing for") != std::string::npos);
}

TEST_CASE("stage faults e2e: a worker that hits its memory limit during training is found by the deadline and evicted") {
  // The coordinator and the workers as separate processes: the victim's address space is limited
  // (prlimit, RLIMIT_AS) once it is admitted and idle, to a little above what it uses then. At its
  // first step its compute needs more: OpenBLAS spins in its buffer allocation (the stage computes
  // forever, heartbeats healthy) or an allocation throws. Either way the job must go on without it
  // and train exactly like the single-process run.
  // Slow heartbeats: the victim's spinning stage takes one of the two cores that 6 workers share,
  // and this test is about the deadline, not about losses by timeout.
  const auto c = make_job(6, 1, 1'500'000, with(slow_heartbeats, quick_deadlines));
  constexpr int steps = 5;
  separate_job job(c, steps);
  auto& victim = job.worker("victim");
  wait_for_event(job.events(), {.kind = event_kind::node_joined, .node = 0, .detail = "victim"}, std::chrono::seconds(30));
  // Admitted: its stage runtime (corpus, threads) is built right after; then it is idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::int64_t idle_kb = 0;
  {
    std::ifstream status("/proc/" + std::to_string(victim.pid()) + "/status");
    std::string key;
    while (status >> key)
      if (key == "VmSize:") status >> idle_kb;
  }
  REQUIRE(idle_kb > 0);
  const rlimit limit{static_cast<rlim_t>((idle_kb + 32 * 1024) * 1024), static_cast<rlim_t>((idle_kb + 32 * 1024) * 1024)};
  REQUIRE(::prlimit(victim.pid(), RLIMIT_AS, &limit, nullptr) == 0);
  MESSAGE("victim idle at " << idle_kb / 1024 << " MiB of address space, limited to " << idle_kb / 1024 + 32 << " MiB");
  for (int i = 1; i < c.nodes; ++i) job.worker("w" + std::to_string(i));
  std::map<std::string, int> exits;
  const run_result r = job.finish(std::chrono::seconds(150), &exits);
  INFO(r.output);
  INFO(describe(r.events));
  REQUIRE(r.status == 0);
  CHECK(evicted(r, 0));
  CHECK(exits.at("victim") == 3);  // told to exit: evicted
  for (int i = 1; i < c.nodes; ++i) CHECK(exits.at("w" + std::to_string(i)) == 0);
  CHECK(contains(r.events, {.kind = event_kind::stopped, .outcome = messages::stop_outcome::finished, .committed = steps}));
  check_trajectory(c, r, steps, {0});
}
