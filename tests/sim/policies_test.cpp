// Each policy on tiny traces whose timelines are computed by hand (tests/sim/fixtures.hpp: every
// Oobleck and Varuna pipeline is one node taking 3000 ms per microbatch; B = 4 microbatches).

#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "planning/synthetic_profile.hpp"
#include "sim/bamboo_policy.hpp"
#include "sim/fixtures.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/simulator.hpp"
#include "sim/varuna_policy.hpp"

using namespace oobleck::sim;
using namespace oobleck::sim::testing;

namespace {

double total(const policy_result& r) {
  double t = 0;
  for (double x : r.breakdown_ms) t += x;
  return t;
}

const char* kFourNodes = "0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n";

}  // namespace

TEST_CASE("oobleck: a loss costs detection, planning and the step in progress, the batch spreads over the rest") {
  // 4 pipelines x 1 microbatch: 3000 ms steps. Node n4 leaves at 10000 during step 4 (9000-12000):
  // 1000 ms lost, 500 + 1000 ms recovery, then 3 pipelines take 2 + 1 + 1 microbatches: 6000 ms
  // steps from 11500 (17500, 23500, 29500) and half a step... 500/6000 of one at 30000.
  const auto trace = instant(std::string(kFourNodes) + "10000,remove,n4\n");
  oobleck_policy p(slow_job(4), round_costs(), 0);
  const auto r = simulate(p, trace, 30000, 4);
  CHECK(r.samples == doctest::Approx(24 + 4.0 * 500 / 6000));
  CHECK(part(r, activity::effective) == doctest::Approx(27500));
  CHECK(part(r, activity::fallback) == 1000);
  CHECK(part(r, activity::reconfiguration) == 1500);
  CHECK(total(r) == doctest::Approx(30000));
  CHECK(r.samples_per_s == doctest::Approx(r.samples / 30));
  REQUIRE(r.decisions.size() == 2);
  CHECK(r.decisions[1].what == "reconfigure");
  CHECK(r.decisions[1].nodes_in_use == 3);
  CHECK(r.decisions[1].step_ms == 6000);
}

TEST_CASE("oobleck: below (f+1) n0 nodes it checkpoints, waits, and resumes from memory when a node is back") {
  // 2 nodes, 2 microbatches each: 6000 ms steps. The loss at 5000 loses the first step; detection
  // 500, checkpoint 1000 (4000 bytes of state at 4000 B/s), waiting until c is ready at 10000; a
  // still holds the layer, so the job resumes from memory as a reconfiguration: planning 1000 and
  // the copy of the layer to c (3000 bytes at 4000 B/s: 750), then steps of 6000 to 23750.
  const auto trace = instant("0,add,a\n0,add,b\n5000,remove,b\n10000,add,c\n");
  oobleck_policy p(slow_job(2), round_costs(), 0);
  const auto r = simulate(p, trace, 23750, 2);
  CHECK(r.samples == 8);
  CHECK(part(r, activity::fallback) == 5000);
  CHECK(part(r, activity::reconfiguration) == 500 + 1750);
  CHECK(part(r, activity::checkpoint) == 1000);
  CHECK(part(r, activity::stopped) == 3500);
  CHECK(part(r, activity::restart) == 0);
  CHECK(part(r, activity::effective) == 12000);
  std::vector<std::string> what;
  for (const auto& d : r.decisions) what.push_back(d.what);
  CHECK(what == std::vector<std::string>{"start", "stop", "wait", "resume"});
  CHECK(r.decisions.back().nodes_in_use == 2);
  CHECK(r.decisions.back().detail.find("from memory") == 0);

  SUBCASE("without a checkpoint folder it waits from the detection on") {
    sim_job job = slow_job(2);
    job.checkpoint_folder = false;
    oobleck_policy q(job, round_costs(), 0);
    const auto s = simulate(q, trace, 23750, 2);
    CHECK(s.samples == 8);
    CHECK(part(s, activity::checkpoint) == 0);
    CHECK(part(s, activity::stopped) == 4500);
    CHECK(part(s, activity::reconfiguration) == 500 + 1750);
  }
}

TEST_CASE("oobleck: when the last holder of a layer goes while it waits, it resumes from the checkpoint") {
  // Steps of 6000 end at 6000 and 12000; b leaves at 14000 (2000 of the third step lost), the job
  // stops (detection 500, checkpoint 14500-15500 of the 8 samples) and waits; a leaves at 16000,
  // taking the last copy of the layer; c and d are ready at 20000: the workers load the checkpoint
  // (planning 1000 + 4000 bytes at 4000 B/s = 2000), then steps from 22000 to 34000.
  const auto trace = instant("0,add,a\n0,add,b\n14000,remove,b\n16000,remove,a\n20000,add,c\n20000,add,d\n");
  oobleck_policy p(slow_job(2), round_costs(), 0);
  CHECK(p.checkpoint_resume_ms() == 2000);
  const auto r = simulate(p, trace, 34000, 2);
  CHECK(r.samples == 16);
  CHECK(part(r, activity::fallback) == 2000);
  CHECK(part(r, activity::checkpoint) == 1000);
  CHECK(part(r, activity::stopped) == 4500);  // 15500-20000
  CHECK(part(r, activity::restart) == 2000);
  CHECK(part(r, activity::effective) == 24000);
  std::vector<std::string> what;
  for (const auto& d : r.decisions) what.push_back(d.what);
  CHECK(what == std::vector<std::string>{"start", "stop", "wait", "restart"});

  SUBCASE("without a checkpoint folder the steps before the stop are lost too") {
    sim_job job = slow_job(2);
    job.checkpoint_folder = false;
    oobleck_policy q(job, round_costs(), 0);
    const auto s = simulate(q, trace, 34000, 2);
    CHECK(s.samples == 8);
    CHECK(part(s, activity::fallback) == 12000 + 2000);
    CHECK(part(s, activity::checkpoint) == 0);
    CHECK(part(s, activity::restart) == 2000);
  }
}

TEST_CASE("oobleck: the nodes it trains on and its step times are the planner's reconfiguration decisions") {
  using namespace oobleck::planning;
  profile prof = synthetic_gpt_profile({.layers = 10, .hidden = 1024, .heads = 16, .sequence = 512,
                                        .microbatch = 1, .gpus_per_node = 1, .device_memory_bytes = 2LL << 30});
  // A link and AdamW, so that every predicted step has a synchronisation part (all-reduce and
  // optimizer) besides the pipelines' schedules, at the start as after each change.
  prof.link = {.latency_ms = 0.05, .bytes_per_ms = 1e6};
  for (auto& l : prof.layers) l.optimizer_ms = 2.0;
  const job_config config{.nodes = 12, .fault_tolerance = 1, .global_batch = 64, .microbatch = 1};
  sim_job job{.profile = prof, .bamboo_profile = prof, .nodes = 12, .fault_tolerance = 1, .global_batch = 64,
              .microbatch = 1, .bamboo_microbatch = 1};
  // Losses one and two at a time, joins, a loss and a join together.
  const std::string text =
      "0,add,a0\n0,add,a1\n0,add,a2\n0,add,a3\n0,add,a4\n0,add,a5\n0,add,a6\n0,add,a7\n0,add,a8\n0,add,a9\n"
      "0,add,a10\n0,add,a11\n100000,remove,a3\n200000,remove,a7\n200000,remove,a8\n300000,add,b0\n"
      "400000,remove,a0\n400000,add,b1\n500000,remove,a11\n";
  const auto trace = instant(text);
  oobleck_policy p(job, {}, 0);
  const auto r = simulate(p, trace, 600000, 12);

  // The same events straight through the planner.
  const job_plan plan = plan_job(prof, config);
  CHECK(p.n0() == plan.spec.n0);
  const layer_costs costs(prof, job_memory(prof, config));
  const reconfiguration_context ctx{plan.templates, costs, 1, plan.num_microbatches, 1};
  cluster_state state{plan.pipelines, plan.idle_nodes};
  std::vector<std::pair<int, double>> expected;
  auto used = [](const std::vector<pipeline_instance>& ps) {
    int n = 0;
    for (const auto& q : ps) n += static_cast<int>(q.nodes.size());
    return n;
  };
  expected.push_back({used(plan.pipelines), plan.step_ms});
  for (const auto& change : trace.changes) {
    if (change.ms == 0) continue;
    const auto next = reconfigure(ctx, state, node_ids(change.removed), node_ids(change.ready));
    REQUIRE(next.action == reconfiguration_action::continue_training);
    expected.push_back({used(next.pipelines), next.step_ms});
    state = {next.pipelines, next.idle_nodes};
  }
  REQUIRE(r.decisions.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(r.decisions[i].nodes_in_use == expected[i].first);
    CHECK(r.decisions[i].step_ms == expected[i].second);
  }
  double slowest = 0;
  for (const auto& q : plan.pipelines) slowest = std::max(slowest, q.time_ms);
  CHECK(plan.step_ms > slowest + 1.0);  // the synchronisation part is there to be counted
  CHECK(expected[2].first < expected[1].first);  // the trace does shrink and grow the job
  CHECK(expected[3].first > expected[2].first);
}

TEST_CASE("oobleck: a resume from memory is the planner's reconfiguration over the last formed configuration") {
  // At exactly (f + 1) n0 nodes, one node of each of two pipelines leaves at once: the job stops
  // and waits (every layer still has a holder). One new node is not enough; with the second the
  // job resumes as the coordinator does: planning::reconfigure from the configuration that formed
  // last with both losses and both joins, priced planning + the copy plan's busiest link.
  using namespace oobleck::planning;
  profile prof = synthetic_gpt_profile({.layers = 10, .hidden = 1024, .heads = 16, .sequence = 512,
                                        .microbatch = 1, .gpus_per_node = 1, .device_memory_bytes = 2LL << 30});
  prof.link = {.latency_ms = 0.05, .bytes_per_ms = 1e6};
  for (auto& l : prof.layers) l.optimizer_ms = 2.0;
  const int n0 = plan_job(prof, {.nodes = 12, .fault_tolerance = 1, .global_batch = 64, .microbatch = 1}).spec.n0;
  const int nodes = 2 * n0;
  const job_config config{.nodes = nodes, .fault_tolerance = 1, .global_batch = 64, .microbatch = 1};
  const job_plan plan = plan_job(prof, config);
  REQUIRE(plan.pipelines.size() == 2u);
  const int v0 = static_cast<int>(plan.pipelines[0].nodes.front().value);
  const int v1 = static_cast<int>(plan.pipelines[1].nodes.back().value);
  std::string text;
  for (int i = 0; i < nodes; ++i) text += "0,add,a" + std::to_string(i) + "\n";
  text += "100000,remove,a" + std::to_string(v0) + "\n100000,remove,a" + std::to_string(v1) + "\n";
  text += "200000,add,b0\n300000,add,b1\n";
  sim_job job{.profile = prof, .bamboo_profile = prof, .nodes = nodes, .fault_tolerance = 1, .global_batch = 64,
              .microbatch = 1, .bamboo_microbatch = 1};
  oobleck_policy p(job, {}, 0);
  REQUIRE(p.n0() == n0);
  const auto r = simulate(p, instant(text), 400000, nodes);

  const layer_costs costs(prof, job_memory(prof, config));
  const reconfiguration_context ctx{plan.templates, costs, 1, plan.num_microbatches, 1};
  // a0.. are ids 0..nodes-1 in the trace's order, b0 and b1 the next two.
  const auto next = reconfigure(ctx, {plan.pipelines, plan.idle_nodes}, node_ids({v0, v1}), node_ids({nodes, nodes + 1}));
  REQUIRE(next.action == reconfiguration_action::continue_training);
  REQUIRE(!next.copies.empty());
  std::vector<std::string> what;
  for (const auto& d : r.decisions) what.push_back(d.what);
  CHECK(what == std::vector<std::string>{"start", "stop", "wait", "resume"});
  const auto& resumed = r.decisions.back();
  CHECK(resumed.ms == 300000);
  int used = 0;
  for (const auto& q : next.pipelines) used += static_cast<int>(q.nodes.size());
  CHECK(resumed.nodes_in_use == used);
  CHECK(resumed.step_ms == next.step_ms);
  const recovery_costs rc;
  CHECK(part(r, activity::reconfiguration) == doctest::Approx(rc.detection_ms + rc.planning_ms + p.copy_ms(next.copies)));
  CHECK(part(r, activity::restart) == 0);
  CHECK(part(r, activity::checkpoint) > 0);  // a checkpoint folder by default
  CHECK(part(r, activity::stopped) > 0);
}

TEST_CASE("varuna: every loss falls back to the last checkpoint and restarts on the best grid") {
  // Checkpoint every 2 steps (1000 ms). Steps 0-3000, 3000-6000, checkpoint to 7000, step 3 ends
  // at 10000 when n4 leaves: it is lost (no checkpoint after it). Detection 500 + restart 3000,
  // then 3 x 1 grid with 6000 ms steps from 13500: 19500, 25500, checkpoint to 26500, then 3500 ms
  // of a step at 30000.
  const auto trace = instant(std::string(kFourNodes) + "10000,remove,n4\n");
  varuna_policy p(slow_job(4), round_costs(), 0);
  const auto r = simulate(p, trace, 30000, 4);
  CHECK(r.samples == doctest::Approx(16 + 4.0 * 3500 / 6000));
  CHECK(part(r, activity::fallback) == 3000);
  CHECK(part(r, activity::checkpoint) == 2000);
  CHECK(part(r, activity::restart) == 3500);
  CHECK(part(r, activity::effective) == doctest::Approx(21500));
  CHECK(r.decisions.back().what == "restart");
  CHECK(r.decisions.back().nodes_in_use == 3);
}

TEST_CASE("varuna: joins that make a faster grid checkpoint at a step boundary and restart on it") {
  // 2 x 1 grid, 6000 ms steps. c and d join at 8000: the step in progress ends at 12000, then a
  // checkpoint (1000) and a restart (3000); 4 x 1 grid with 3000 ms steps from 16000, a cadence
  // checkpoint after two of them (22000-23000), one more step to 26000.
  const auto trace = instant("0,add,a\n0,add,b\n8000,add,c\n8000,add,d\n");
  varuna_policy p(slow_job(4), round_costs(), 0);
  const auto r = simulate(p, trace, 26000, 4);
  CHECK(r.samples == 20);
  CHECK(part(r, activity::checkpoint) == 2000);
  CHECK(part(r, activity::restart) == 3000);
  CHECK(part(r, activity::fallback) == 0);
  CHECK(r.decisions.back().what == "morph");
  SUBCASE("a join that makes no faster grid waits") {
    const auto t2 = instant("0,add,a\n0,add,b\n8000,add,c\n");  // 3 nodes: still 2 microbatches each
    varuna_policy q(slow_job(4), round_costs(), 0);
    const auto r2 = simulate(q, t2, 25000, 4);  // steps end 6000, 12000, (checkpoint) 19000, 25000
    CHECK(r2.samples == 16);
    CHECK(r2.decisions.size() == 1);
  }
}

TEST_CASE("bamboo: redundant forwards lengthen every step, a predecessor takes a lost stage over") {
  // Two 2-stage pipelines (forward 1000 + 1000 redundant, backward 2000 per stage), 2 microbatches
  // each: 1F1B makespan 12000 ms, 9000 without the redundant forwards. Node 1 (stage 1 of
  // pipeline 0) leaves at 15000: 3000 ms of the step lost, detection 500 + takeover 1000; node 0
  // then runs both stages (forward 2000, backward 4000, no replica left): 2 x 6000 = 12000 ms,
  // which the other pipeline's redundant forwards no longer lengthen.
  const auto trace = instant(std::string(kFourNodes) + "15000,remove,n2\n");
  bamboo_policy p(slow_job(4), round_costs(), 0);
  const auto r = simulate(p, trace, 40000, 4);
  CHECK(r.samples == doctest::Approx(8 + 4 * 11500.0 / 12000));
  CHECK(part(r, activity::redundant) == doctest::Approx(3000));
  CHECK(part(r, activity::fallback) == 3000);
  CHECK(part(r, activity::reconfiguration) == 1500);
  CHECK(part(r, activity::effective) == doctest::Approx(32500));
  CHECK(r.decisions.back().what == "takeover");
  CHECK(r.decisions.back().nodes_in_use == 3);

  SUBCASE("losing the node that took over is fatal: restart on a new grid") {
    // At 20000 node 0 leaves: 3500 ms lost, detection 500, restart 2000 + 8000 B / 4000 B/s, then
    // one pipeline of n3, n4 with 4 microbatches: (4 + 1) x 4000 = 20000 ms per step, 15000
    // without the redundant forwards, from 24500; 15500 ms of it by 40000.
    const auto t2 = instant(std::string(kFourNodes) + "15000,remove,n2\n20000,remove,n1\n");
    bamboo_policy q(slow_job(4), round_costs(), 0);
    const auto r2 = simulate(q, t2, 40000, 4);
    CHECK(r2.samples == doctest::Approx(4 + 4 * 15500.0 / 20000));
    CHECK(part(r2, activity::fallback) == 6500);
    CHECK(part(r2, activity::reconfiguration) == 2000);
    CHECK(part(r2, activity::restart) == 4000);
    CHECK(part(r2, activity::redundant) == doctest::Approx(3000 + 5000 * 15500.0 / 20000));
    CHECK(total(r2) == doctest::Approx(40000));
    CHECK(r2.decisions.back().what == "restart");
  }
}

TEST_CASE("every policy's step adds each node's gradient all-reduce over the pipelines and AdamW") {
  // A link of 10 ms + 1 ms per 100 bytes and 100 ms of AdamW per layer. Oobleck and Varuna: 4
  // one-node pipelines of the 1000-byte layer, 1 microbatch each (3000 ms), then a ring
  // all-reduce over 4 holders, 2 x 3 messages of 250 bytes (6 x 12.5 = 75 ms), and AdamW:
  // 3175 ms. Bamboo: two 2-stage pipelines (12000 ms, as above), each node all-reducing its
  // layer over 2 holders (2 x 15 = 30 ms) and AdamW: 12130 ms; after the takeover, node 0 runs
  // both stages: 12000 + 2 x 130 ms.
  sim_job job = slow_job(4);
  for (auto* prof : {&job.profile, &job.bamboo_profile}) {
    prof->link = {.latency_ms = 10, .bytes_per_ms = 100};
    for (auto& l : prof->layers) l.optimizer_ms = 100;
  }
  const auto trace = instant(std::string(kFourNodes) + "15000,remove,n2\n");
  oobleck_policy o(job, round_costs(), 0);
  varuna_policy v(job, round_costs(), 0);
  bamboo_policy b(job, round_costs(), 0);
  const auto ro = simulate(o, instant(kFourNodes), 10000, 4);
  const auto rv = simulate(v, instant(kFourNodes), 10000, 4);
  const auto rb = simulate(b, trace, 40000, 4);
  REQUIRE(!ro.decisions.empty());
  REQUIRE(!rv.decisions.empty());
  REQUIRE(rb.decisions.size() >= 2);
  CHECK(ro.decisions[0].step_ms == doctest::Approx(3175));
  CHECK(rv.decisions[0].step_ms == doctest::Approx(3175));
  CHECK(rb.decisions[0].step_ms == doctest::Approx(12130));
  CHECK(rb.decisions.back().what == "takeover");
  CHECK(rb.decisions.back().step_ms == doctest::Approx(12260));
}

TEST_CASE("bamboo: twice the state that does not fit is out of memory, and it never trains") {
  sim_job job = slow_job(4);
  // 2 layers x 1000 bytes x 4 = 8000 bytes of state: one stage of 4000 fits in 5000 bytes, twice
  // that does not.
  job.bamboo_profile = slow_profile(2, 5000);
  bamboo_policy p(job, round_costs(), 0);
  CHECK(p.never_runs().find("out of memory") == 0);
  const auto r = simulate(p, instant(kFourNodes), 10000, 4);
  CHECK(r.samples == 0);
  CHECK(part(r, activity::stopped) == 10000);
}

TEST_CASE("nodes beyond --nodes wait as spares and replace lost ones") {
  const auto trace = instant("0,add,a\n0,add,b\n0,add,c\n10000,remove,a\n");
  oobleck_policy p(slow_job(2), round_costs(), 0);
  const auto r = simulate(p, trace, 20000, 2);
  REQUIRE(r.decisions.size() == 2);
  CHECK(r.decisions[0].nodes_in_use == 2);
  CHECK(r.decisions[1].nodes_in_use == 2);  // c replaced a
}
