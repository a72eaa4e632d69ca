// Profile at job start on CAF's deterministic scheduler (fixture: protocol_fixture.hpp): a job
// without a profile has one of its admitted nodes measure the model, and plans its first epoch
// from that profile, not from the modelled one; a node that cannot measure stops the job with the
// reason instead of leaving it planned on guesses.

#include <doctest/doctest.h>

#include <string>

#include "actors/protocol_fixture.hpp"
#include "planning/planner.hpp"

using namespace oobleck::messages;
using namespace oobleck::testing;

namespace {

/// A device memory for which the job plans fewer pipelines than on the modelled profile (the
/// model no longer fits one node): a measured profile that must change the first plan.
std::int64_t smaller_device(const fixture& f) {
  auto measured = f.profile;
  for (std::int64_t m = f.profile.device_memory_bytes / 2; m > 1024; m /= 2) {
    measured.device_memory_bytes = m;
    try {
      if (oobleck::planning::plan_job(measured, f.job).pipelines.size() < f.plan.pipelines.size()) return m;
    } catch (const std::exception&) {
      return -1;  // too small to plan at all before a smaller plan was found
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("profile at job start: one admitted node measures the model, and the first epoch is planned from its profile") {
  auto o = fixture::roomy(4, 2);
  o.profile_at_start = true;
  fixture f(o);
  const std::int64_t memory = smaller_device(f);
  REQUIRE(memory > 0);
  f.measured.device_memory_bytes = memory;
  f.measured.layers[0].forward_ms[0] *= 3;
  const auto expected = oobleck::planning::plan_job(f.measured, f.job);
  f.start();
  INFO(describe(f.events));
  CHECK(f.happened(finished(2)));
  // One node was asked, once, before any epoch: the first admitted.
  REQUIRE(f.profiled_by.size() == 1u);
  CHECK(f.profiled_by[0] == "w0");
  REQUIRE(f.profiled.size() == 1u);
  CHECK(f.profiled[0].device_memory_bytes == memory);
  CHECK(f.profiled[0].layers[0].forward_ms[0] == doctest::Approx(f.measured.layers[0].forward_ms[0]));
  CHECK(count(f.events, {.kind = event_kind::epoch_forming}) == 1u);
  // The first epoch is the measured profile's plan, not the modelled one's.
  REQUIRE(f.records.size() == 2u);
  CHECK(f.records[0].pipelines.size() == expected.pipelines.size());
  CHECK(f.records[0].pipelines.size() < f.plan.pipelines.size());
}

TEST_CASE("profile at job start: a job with a profile asks no node") {
  fixture f(fixture::roomy(4, 2));
  f.start();
  CHECK(f.happened(finished(2)));
  CHECK(f.profiled_by.empty());
  CHECK(f.profiled.empty());
  CHECK(f.records[0].pipelines.size() == f.plan.pipelines.size());
}

TEST_CASE("profile at job start: a node whose profiler fails stops the job, saying why, before any epoch") {
  auto o = fixture::roomy(2, 2);
  o.profile_at_start = true;
  fixture f(o);
  f.add_worker({.name = "w0", .profile_fails = true});
  f.add_worker({.name = "w1"});
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.profiled_by == std::vector<std::string>{"w0"});
  CHECK(f.profiled.empty());
  CHECK(!f.happened({.kind = event_kind::epoch_forming}));
  const auto stopped = all_of(f.events, {.kind = event_kind::stopped});
  REQUIRE(stopped.size() == 1u);
  CHECK(stopped[0].outcome == stop_outcome::failed);
  CHECK(stopped[0].detail.find("out of memory (testing)") != std::string::npos);
}
