// Issue 27: the failure process, checkpoint-restart with asynchronous checkpoints and TorchFT-style
// replica groups on hand-computed cases (tests/sim/fixtures.hpp: every pipeline is one node taking
// 3000 ms per microbatch; B = 4 microbatches), the frontier model, and a 16,384-GPU run.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <set>

#include "messages/input_error.hpp"
#include "sim/checkpoint_restart_policy.hpp"
#include "sim/failure_process.hpp"
#include "sim/fixtures.hpp"
#include "sim/model_zoo.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/replica_group_policy.hpp"
#include "sim/simulator.hpp"

using namespace oobleck::sim;
using namespace oobleck::sim::testing;

namespace {

int failures(const cluster_trace& t) {
  int n = 0;
  for (const auto& c : t.changes) n += static_cast<int>(c.removed.size());
  return n;
}

const char* kFourAndSpare = "0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n0,add,n5\n";

}  // namespace

TEST_CASE("failure process: failures come at the rate the MTTF says, the same for a seed") {
  // 100 nodes, job MTTF 1 h, repairs after 36 s so that ~100 nodes are always up: over 2,000 h
  // about 2,000 failures (Poisson: standard deviation ~45; 4 of them allowed).
  const failure_process p{.nodes = 100, .mttf_h = 1, .repair_h = 0.01, .duration_h = 2000, .seed = 7};
  const auto t = generate_failures(p);
  const int n = failures(t);
  CHECK(std::abs(n - 2000) < 4 * std::sqrt(2000.0));
  // The mean gap between failures is the MTTF.
  std::vector<double> at;
  for (const auto& c : t.changes)
    if (!c.removed.empty()) at.push_back(c.ms);
  const double mean_gap_h = (at.back() - at.front()) / (at.size() - 1) / 3600e3;
  CHECK(mean_gap_h == doctest::Approx(1.0).epsilon(0.1));
  // Reproducible, and the seed matters.
  const auto again = generate_failures(p);
  REQUIRE(again.changes.size() == t.changes.size());
  for (std::size_t i = 0; i < t.changes.size(); ++i) {
    CHECK(again.changes[i].ms == t.changes[i].ms);
    CHECK(again.changes[i].removed == t.changes[i].removed);
  }
  auto other = p;
  other.seed = 8;
  CHECK(generate_failures(other).changes[1].ms != t.changes[1].ms);
  // A higher MTTF, fewer failures: 4 h gives about 500.
  auto rarer = p;
  rarer.mttf_h = 4;
  CHECK(std::abs(failures(generate_failures(rarer)) - 500) < 4 * std::sqrt(500.0));
}

TEST_CASE("failure process: a repaired node comes back as a new node after the repair time") {
  const failure_process p{.nodes = 8, .spare_nodes = 2, .mttf_h = 2, .repair_h = 3, .duration_h = 200, .seed = 3};
  const auto t = generate_failures(p);
  REQUIRE(t.changes.size() > 2);
  CHECK(t.changes[0].ready.size() == 10);
  std::set<int> alive(t.changes[0].ready.begin(), t.changes[0].ready.end());
  std::vector<double> removed_at, ready_at;
  std::set<int> ever;
  for (std::size_t i = 1; i < t.changes.size(); ++i) {
    const auto& c = t.changes[i];
    for (int n : c.removed) {
      CHECK(alive.erase(n) == 1);  // only alive nodes fail
      removed_at.push_back(c.ms);
    }
    for (int n : c.ready) {
      CHECK(n >= 10);
      CHECK(ever.insert(n).second);  // a new id every time
      alive.insert(n);
      ready_at.push_back(c.ms);
    }
  }
  // Every repair is a failure 3 h earlier, in order; failures in the last 3 h are still out.
  REQUIRE(ready_at.size() <= removed_at.size());
  for (std::size_t i = 0; i < ready_at.size(); ++i) CHECK(ready_at[i] == doctest::Approx(removed_at[i] + 3 * 3600e3));
  for (std::size_t i = ready_at.size(); i < removed_at.size(); ++i) CHECK(removed_at[i] + 3 * 3600e3 >= 200 * 3600e3);
  CHECK(t.most_alive == 10);
  // Without repair the cluster only shrinks.
  auto never = p;
  never.repair_h = 0;
  for (const auto& c : generate_failures(never).changes) CHECK((c.ms == 0 || c.ready.empty()));
}

TEST_CASE("failure process: Meta's MTTF by size, and bad parameters are refused") {
  CHECK(default_mttf_h(1024) == doctest::Approx(7.9));
  CHECK(default_mttf_h(16384) == doctest::Approx(1.8));
  CHECK(default_mttf_h(4096) < 7.9);
  CHECK(default_mttf_h(4096) > 1.8);
  using oobleck::messages::input_error;
  CHECK_THROWS_AS(generate_failures({.nodes = 0, .mttf_h = 1, .duration_h = 1}), input_error);
  CHECK_THROWS_AS(generate_failures({.nodes = 4, .mttf_h = 0, .duration_h = 1}), input_error);
  CHECK_THROWS_AS(generate_failures({.nodes = 4, .mttf_h = 1, .repair_h = -1, .duration_h = 1}), input_error);
  CHECK_THROWS_AS(generate_failures({.nodes = 4, .mttf_h = 1, .duration_h = 0}), input_error);
}

namespace {

/// round_costs with asynchronous checkpoints: the state (4000 bytes) snapshots in 1000 ms and
/// writes in 1000 ms; a checkpoint every 6 s (2 steps).
recovery_costs async_costs() {
  auto c = round_costs();
  c.snapshot_bytes_per_s = 4000;
  c.storage_bytes_per_s = 4000;
  c.checkpoint_interval_s = 6;
  return c;
}

}  // namespace

TEST_CASE("ckpt-restart: a failure before the background write completes falls back to the checkpoint before") {
  // 4 one-node pipelines, 3000 ms steps of 4 samples; a 1000 ms snapshot after every 2 steps
  // (6000-7000, 13000-14000), each durable 1000 ms after it. n4 fails at 14500, before the second
  // write completes (15000): the progress since 7000 is lost (6000 ms of steps and 500 ms of the
  // step in progress), then detection 500 and restart 2000 + 4000 / 4000 s on the spare n5; steps
  // again from 18000, the run ends at 23000 within the second of them.
  const auto trace = instant(std::string(kFourAndSpare) + "14500,remove,n4\n");
  checkpoint_restart_policy p(slow_job(4), async_costs(), 0, 0);
  CHECK(p.configuration().pipelines == 4);
  CHECK(p.configuration().depth == 1);
  CHECK(p.snapshot_ms() == 1000);
  CHECK(p.write_ms() == 1000);
  CHECK(p.restart_ms() == 3000);
  const auto r = simulate(p, trace, 23000, 4);
  CHECK(r.samples == doctest::Approx(8 + 4 + 4.0 * 2 / 3));
  CHECK(part(r, activity::checkpoint) == 2000);
  CHECK(part(r, activity::fallback) == 6500);
  CHECK(part(r, activity::restart) == 3500);
  CHECK(part(r, activity::effective) == doctest::Approx(11000));
  CHECK(r.failure_free_samples_per_s == doctest::Approx(4.0 / 3));
  REQUIRE(r.decisions.size() == 2);
  CHECK(r.decisions[1].what == "restart");
  CHECK(r.decisions[1].nodes_in_use == 4);

  SUBCASE("after the write it loses only the step in progress") {
    const auto later = instant(std::string(kFourAndSpare) + "15500,remove,n4\n");
    checkpoint_restart_policy q(slow_job(4), async_costs(), 0, 0);
    const auto s = simulate(q, later, 24000, 4);
    CHECK(part(s, activity::fallback) == 1500);  // 14000-15500
    CHECK(part(s, activity::restart) == 3500);
  }
  SUBCASE("without a healthy node to replace the lost one it waits") {
    const auto no_spare = instant("0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n15500,remove,n4\n20000,add,n6\n");
    checkpoint_restart_policy q(slow_job(4), async_costs(), 0, 0);
    const auto s = simulate(q, no_spare, 26000, 4);
    CHECK(part(s, activity::stopped) == 4000);   // 16000-20000
    CHECK(part(s, activity::restart) == 3500);   // 15500-16000, 20000-23000
    CHECK(s.decisions.back().what == "restart");
  }
  SUBCASE("a spare lost costs nothing") {
    const auto spare_lost = instant(std::string(kFourAndSpare) + "14500,remove,n5\n");
    checkpoint_restart_policy q(slow_job(4), async_costs(), 0, 0);
    CHECK(part(simulate(q, spare_lost, 23000, 4), activity::fallback) == 0);
  }
}

TEST_CASE("ckpt-restart: Young-Daly's interval for the MTTF, never shorter than a write") {
  auto c = async_costs();
  c.checkpoint_interval_s = 0;
  // sqrt(2 x 1000 ms x 18000 ms) = 6000 ms.
  CHECK(checkpoint_restart_policy(slow_job(4), c, 0, 18000).interval_ms() == doctest::Approx(6000));
  c.storage_bytes_per_s = 400;  // a write of 10 s
  CHECK(checkpoint_restart_policy(slow_job(4), c, 0, 18000).interval_ms() == doctest::Approx(10000));
}

TEST_CASE("torchft: a failure takes its group out and the batch shrinks until a replacement group has started") {
  // 4 groups of one node, 3000 ms steps of 4 samples. n4 fails at 10000 (step 9000-12000): the
  // step is lost for all (1000 ms), detection 500 + quorum 1000, then 3 groups step on with 3
  // samples per step from 11500. The spare n5 starts a group: 2000 ms start-up + 1000 ms state
  // copy, ready at 13000; it joins after the step in progress (14500) with a 1000 ms quorum; from
  // 15500 4 groups again, two steps to 21500.
  const auto trace = instant(std::string(kFourAndSpare) + "10000,remove,n4\n");
  replica_group_policy p(slow_job(4), round_costs(), 0);
  CHECK(p.heal_ms() == 1000);
  const auto r = simulate(p, trace, 21500, 4);
  CHECK(r.samples == doctest::Approx(12 + 3 + 8));
  CHECK(part(r, activity::fallback) == 1000);
  CHECK(part(r, activity::reconfiguration) == 2500);
  CHECK(part(r, activity::effective) == doctest::Approx(18000));
  std::vector<std::string> what;
  for (const auto& d : r.decisions) what.push_back(d.what);
  CHECK(what == std::vector<std::string>{"start", "shrink", "grow"});
  // 23 samples against 4 / 3 per second for 21.5 s; the shrunk step's quarter is "slower".
  CHECK(effective_share(r) == doctest::Approx(23.0 / (4.0 / 3 * 21.5)));
  const auto lost = lost_time(r);
  CHECK(lost.slower == doctest::Approx(750));
  CHECK(lost.effective + lost.slower + lost.fallback + lost.reconfiguration == doctest::Approx(21500));

  SUBCASE("without a replacement the survivors go on alone") {
    const auto alone = instant("0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n10000,remove,n4\n");
    replica_group_policy q(slow_job(4), round_costs(), 0);
    const auto s = simulate(q, alone, 20500, 4);
    CHECK(s.samples == doctest::Approx(12 + 3 * 3));  // 11500-20500: three steps of 3
    CHECK(s.decisions.back().what == "shrink");
  }
  SUBCASE("a warm spare group replaces a lost one after only the state copy") {
    auto c = round_costs();
    c.spare_groups = 1;
    replica_group_policy q(slow_job(4), c, 0);
    const auto s = simulate(q, trace, 21500, 5);  // n5 is the policy's from the start
    // The spare group starts at 0 and is warm at 3000; at the loss it only copies the state
    // (ready at 10000 + 500 + 1000 + 1000 = 12500, against 13000 for a group starting then).
    REQUIRE(s.decisions.size() == 3);
    CHECK(s.decisions[1].what == "shrink");
    CHECK(s.decisions[2].what == "grow");
    CHECK(s.decisions[2].ms == doctest::Approx(12500));
    REQUIRE(r.decisions.size() == 3);
    CHECK(r.decisions[2].ms == doctest::Approx(13000));
  }
}

TEST_CASE("dense-400b: 126 layers, ~400B parameters, 16 bytes of state each, and a node holds about 11 layers") {
  const auto m = frontier_model();
  CHECK(m.blocks == 126);
  CHECK(m.parameters() == doctest::Approx(4.1e11).epsilon(0.02));
  const auto p = frontier_profile();
  CHECK(p.num_layers() == 126);
  CHECK(p.gpus_per_node == 8);
  double bytes = 0;
  for (const auto& l : p.layers) bytes += static_cast<double>(l.param_bytes);
  CHECK(bytes == doctest::Approx(2 * m.parameters()).epsilon(0.001));  // bf16
  const auto job = frontier_job(2048, 1);
  CHECK(job.global_batch == 2048);
  CHECK(job.state_factor == 8);
  auto probe = job;
  probe.max_template_nodes = 1;  // only n0
  const auto t = plan_templates(probe);
  // 6.56e12 bytes of state over 8 x 72 GB: at least 12 nodes; activations take the rest.
  CHECK(t->n0 >= 12);
  CHECK(t->n0 <= 14);
}

TEST_CASE("a 16,384-GPU job under Meta's failure rate for a simulated week finishes in seconds") {
  const int nodes = 2048;
  sim_job job = frontier_job(nodes, 1);
  auto probe = job;
  probe.max_template_nodes = 1;
  job.max_template_nodes = plan_templates(probe)->n0 + 2;  // a few templates keep the test short
  const auto t0 = std::chrono::steady_clock::now();
  job.templates = plan_templates(job);
  const failure_process fp{.nodes = nodes, .spare_nodes = 40, .mttf_h = default_mttf_h(16384), .repair_h = 24,
                           .duration_h = 7 * 24, .seed = 1};
  const auto trace = generate_failures(fp);
  const int n = failures(trace);
  CHECK(std::abs(n - 7 * 24 / 1.8) < 4 * std::sqrt(7 * 24 / 1.8));
  const auto costs = frontier_recovery_costs();
  oobleck_policy o(job, costs, 0);
  checkpoint_restart_policy c(job, costs, 0, 1.8 * 3600e3);
  replica_group_policy g(job, costs, 0);
  for (policy* p : std::initializer_list<policy*>{&o, &c, &g}) {
    const auto r = simulate(*p, trace, trace.end_ms, nodes);
    INFO(r.policy);
    CHECK(r.never_runs.empty());
    CHECK(r.failure_free_samples_per_s > 0);
    CHECK(effective_share(r) > 0.5);
    CHECK(effective_share(r) < 1.0);
    CHECK(r.decisions.size() > 1);
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 50);
}
