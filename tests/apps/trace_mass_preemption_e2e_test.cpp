// A mass preemption replayed end to end (issue 25, item 7): `oobleck-local --trace` replays a trace
// whose removals take more than f nodes at once, so fewer than (f + 1) n0 nodes remain. A trace
// replay always waits below the minimum (item 6): the coordinator reports waiting, admits the
// workers the trace's later adds start, resumes by itself once (f + 1) n0 nodes are there, and
// the run goes on to the trace's end. Every committed step is the failure-free run's (B samples,
// every layer's holders in agreement, the one-process loss within 1e-4), and the metrics carry a
// waiting_for_nodes and a resumed record. The trace is written here; every wait has a deadline
// (oobleck-local's --timeout, the harness's own).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "actors/recovery_e2e_support.hpp"
#include "support/job_events.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

const nlohmann::json* record(const run_result& r, const std::string& event) {
  for (const auto& rec : r.records)
    if (rec.value("event", "") == event) return &rec;
  return nullptr;
}

}  // namespace

TEST_CASE("trace e2e: a mass preemption beyond f: the replay waits for the trace's new nodes and resumes from memory") {
  // Four nodes, f = 1, two pipelines of two (n0 = 2: (f + 1) n0 = 4). At 2 s the trace removes
  // both nodes of one pipeline at once; the other pipeline holds every layer. Its adds at 4 s and
  // 6 s start one worker each: after the first the job still has 3 nodes and keeps waiting (the
  // worker is admitted all the same); after the second it resumes from the survivors' memory and
  // trains on the four until the trace ends at 20 s.
  const auto c = make_job(4, 1, 1'500'000);
  const planner_model model(c);
  const auto first = model.initial();
  REQUIRE(model.n0() == 2);
  REQUIRE(first.pipelines.size() == 2u);
  REQUIRE(first.pipelines[0].nodes.size() == 2u);
  // Worker i runs the trace's i-th starting node (n1 is worker 0) and is node i.
  std::set<int> victims;
  for (auto n : first.pipelines[0].nodes) victims.insert(static_cast<int>(n.value));
  const testing::temp_dir tmp("oobleck-mass-trace-");
  const auto trace = (tmp.path() / "mass.csv").string();
  {
    std::ofstream t(trace);
    for (int i = 1; i <= 4; ++i) t << "0,add,n" << i << "\n";
    for (int v : victims) t << "2000,remove,n" << v + 1 << "\n";
    t << "4000,add,n5\n6000,add,n6\n20000,add,n7\n";  // n7: the trace's end, never started
  }
  const auto r = run_local(c, 0, {"--trace", trace, "--time-scale", "1", "--trace-nodes", "4"});
  INFO(r.output);
  INFO(describe(r.events));
  // The trace's end stopped the job in order (no exit below the minimum).
  CHECK(r.status == 0);
  CHECK(contains(r.events, {.kind = event_kind::stopped, .outcome = messages::stop_outcome::shutdown}));
  CHECK(!contains(r.events, {.kind = event_kind::stopped, .outcome = messages::stop_outcome::checkpoint_and_stop}));
  // Both victims lost, then the wait, the two new workers admitted (workers node4 and node5), the
  // resume.
  for (int v : victims) CHECK(contains(r.events, {.kind = event_kind::node_lost, .node = v}));
  const auto waiting = position(r.events, {.kind = event_kind::waiting_for_nodes});
  const auto resumed = position(r.events, {.kind = event_kind::resumed});
  const auto joined4 = position(r.events, {.kind = event_kind::node_joined, .detail = "node4"});
  const auto joined5 = position(r.events, {.kind = event_kind::node_joined, .detail = "node5"});
  REQUIRE(waiting < r.events.size());
  REQUIRE(resumed < r.events.size());
  REQUIRE(joined4 < r.events.size());
  REQUIRE(joined5 < r.events.size());
  const std::set<int> newcomers{static_cast<int>(r.events[joined4].node), static_cast<int>(r.events[joined5].node)};
  REQUIRE(newcomers.size() == 2u);
  for (int v : victims) CHECK(position(r.events, {.kind = event_kind::node_lost, .node = v}) < resumed);
  CHECK(waiting < joined4);
  CHECK(joined4 < resumed);  // admitted while waiting, with 3 nodes: not enough to resume
  CHECK(joined5 < resumed);
  CHECK(!contains(r.events, {.kind = event_kind::node_joined, .detail = "node6"}));
  // The metrics records: waiting with fewer than 4 (3 when the coordinator learnt of one loss
  // first, else 2), resumed from memory on 4 nodes.
  const auto* wait_rec = record(r, "waiting_for_nodes");
  REQUIRE(wait_rec != nullptr);
  CHECK((*wait_rec)["have"].get<int>() < 4);
  CHECK((*wait_rec)["need"] == 4);
  const auto* resume_rec = record(r, "resumed");
  REQUIRE(resume_rec != nullptr);
  CHECK((*resume_rec)["source"] == "memory");
  CHECK((*resume_rec)["nodes"] == 4);
  CHECK((*resume_rec)["waited_ms"].get<double>() > 0);
  const int resumed_at = (*resume_rec)["step"].get<int>();
  // Every committed step once, in order, on the failure-free trajectory; none ran twice (from
  // memory: nothing goes back to a checkpoint); after the resume the lost nodes compute nothing
  // and both new ones do.
  const int steps = static_cast<int>(r.steps.size());
  REQUIRE(resumed_at >= 1);
  REQUIRE(steps > resumed_at + 5);
  const auto& reference = reference_losses(steps);
  REQUIRE(static_cast<int>(reference.size()) >= steps);
  std::set<int> after;
  for (int k = 0; k < steps; ++k) {
    const auto& m = r.steps[static_cast<std::size_t>(k)];
    CAPTURE(k);
    CHECK(m["step"] == k);
    CHECK(m["samples"] == c.job.training.global_batch);
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    const double want = reference[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
    if (k < resumed_at) continue;
    for (const auto& p : m["pipelines"])
      for (const auto& n : p["nodes"]) {
        CHECK(!victims.count(n.get<int>()));
        after.insert(n.get<int>());
      }
  }
  for (int n : newcomers) CHECK(after.count(n) == 1);
}
