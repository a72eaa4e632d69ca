#include "planning/reconfiguration.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "planning/holdings.hpp"
#include "planning/node_spec.hpp"
#include "support/brute_force.hpp"

using namespace oobleck::planning;

namespace {

pipeline_instance pipe(std::initializer_list<int> nodes, int template_nodes) { return {node_ids(nodes), template_nodes}; }

// 8 equal layers of 100 parameter bytes; with state factor 4 and 2000 bytes a node holds at most
// 5 layers, so n0 = 2 (M = 1).
profile eight_layers() {
  profile p;
  p.model = "eight";
  p.microbatch_size = 1;
  p.gpus_per_node = 1;
  p.device_memory_bytes = 2000;
  for (int l = 0; l < 8; ++l) p.layers.push_back({"l" + std::to_string(l), {1.0}, {2.0}, 100, 0});
  return p;
}

struct fixture {
  profile prof;
  job_config job;
  job_plan plan;
  layer_costs costs;
  fixture(profile p, job_config j)
      : prof(std::move(p)), job(j), plan(plan_job(prof, job)), costs(prof, job_memory(prof, job)) {}
  reconfiguration_context ctx() const {
    return {plan.templates, costs, job.fault_tolerance, plan.num_microbatches, job.microbatch};
  }
};

using oobleck::testing::holdings_of;

std::vector<int> sizes_of(const reconfiguration& r) {
  std::vector<int> s;
  for (const auto& p : r.pipelines) s.push_back(static_cast<int>(p.nodes.size()));
  std::sort(s.begin(), s.end());
  return s;
}

/// The most nodes that between min_p and max_p pipelines of the given sizes use, by enumeration.
int most_usable(const std::vector<int>& sizes, int min_p, int max_p, int nodes) {
  int best = 0;
  std::function<void(std::size_t, int, int)> rec = [&](std::size_t j, int used, int count) {
    if (count >= min_p && count <= max_p) best = std::max(best, used);
    if (j == sizes.size() || count == max_p) return;
    for (int x = 0; used + x * sizes[j] <= nodes && count + x <= max_p; ++x) rec(j + 1, used + x * sizes[j], count + x);
  };
  rec(0, 0, 0);
  return best;
}

bool holds(const std::map<node_id, std::pair<int, int>>& h, node_id node, int layer) {
  auto it = h.find(node);
  return it != h.end() && layer >= it->second.first && layer < it->second.second;
}

}  // namespace

TEST_CASE("simple: a pipeline that keeps >= n0 nodes is re-instantiated from its remaining size") {
  fixture f(eight_layers(), {.nodes = 7, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  REQUIRE(f.plan.spec.n0 == 2);
  cluster_state state{{pipe({0, 1, 2, 3}, 4), pipe({4, 5, 6}, 3)}, {}};
  const std::vector<node_id> lost = node_ids({2});
  const auto r = reconfigure(f.ctx(), state, lost, {});
  REQUIRE(r.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(r) == std::vector<int>{3, 3});
  CHECK(r.rules == std::vector<reconfiguration_rule>{reconfiguration_rule::simple});
  // Survivors keep their pipeline and order.
  CHECK(r.pipelines[0].nodes == node_ids({0, 1, 3}));
}

TEST_CASE("borrow: a pipeline below n0 takes a node from one that can spare it") {
  fixture f(eight_layers(), {.nodes = 6, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  cluster_state state{{pipe({0, 1, 2, 3}, 4), pipe({4, 5}, 2)}, {}};
  const std::vector<node_id> lost = node_ids({5});
  const auto r = reconfigure(f.ctx(), state, lost, {});
  REQUIRE(r.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(r) == std::vector<int>{2, 3});
  CHECK(std::find(r.rules.begin(), r.rules.end(), reconfiguration_rule::borrow) != r.rules.end());
  // Node 3 was lent to node 4's pipeline and needs the layers it did not hold.
  bool copied_to_3 = false;
  for (const auto& c : r.copies) copied_to_3 = copied_to_3 || c.to_node == node_id{3};
  CHECK(copied_to_3);
}

TEST_CASE("merge: pipelines that cannot borrow pool their nodes") {
  fixture f(eight_layers(), {.nodes = 6, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  cluster_state state{{pipe({0, 1}, 2), pipe({2, 3}, 2), pipe({4, 5}, 2)}, {}};
  const std::vector<node_id> lost = node_ids({1, 3});
  const auto r = reconfigure(f.ctx(), state, lost, {});
  REQUIRE(r.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(r) == std::vector<int>{2, 2});
  CHECK(std::find(r.rules.begin(), r.rules.end(), reconfiguration_rule::merge) != r.rules.end());
  CHECK(r.idle_nodes.empty());
}

TEST_CASE("join: new nodes are put to work") {
  // Planned for 6 nodes (templates of 2..4), running on 4 after earlier losses; 3 nodes join.
  fixture f(eight_layers(), {.nodes = 6, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  cluster_state state{{pipe({0, 1}, 2), pipe({2, 3}, 2)}, {}};
  const std::vector<node_id> joined = node_ids({6, 7, 8});
  const auto r = reconfigure(f.ctx(), state, {}, joined);
  REQUIRE(r.action == reconfiguration_action::continue_training);
  int used = 0;
  for (const auto& p : r.pipelines) used += static_cast<int>(p.nodes.size());
  CHECK(used == 7);
  CHECK(r.idle_nodes.empty());
  CHECK(r.rules == std::vector<reconfiguration_rule>{reconfiguration_rule::join});
  // The running pipelines keep their nodes; joined nodes only receive copies.
  for (const auto& c : r.copies) CHECK(c.to_node.value >= 6);
}

TEST_CASE("nodes the templates cannot cover stay idle, and are used once they can be") {
  // N = 4, f = 1: the only template has 2 nodes, so 7 nodes leave one idle.
  fixture f(eight_layers(), {.nodes = 4, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  cluster_state state{{pipe({0, 1}, 2), pipe({2, 3}, 2)}, {}};
  const auto r = reconfigure(f.ctx(), state, {}, node_ids({4, 5, 6}));
  REQUIRE(r.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(r) == std::vector<int>{2, 2, 2});
  CHECK(r.idle_nodes.size() == 1);
  const auto again = reconfigure(f.ctx(), {r.pipelines, r.idle_nodes}, {}, node_ids({7}));
  CHECK(sizes_of(again) == std::vector<int>{2, 2, 2, 2});
  CHECK(again.idle_nodes.empty());
}

TEST_CASE("joins beyond what B/b pipelines can use leave nodes idle instead of failing") {
  // Templates of 2..4 nodes; B/b = 2 microbatches, so at most 2 pipelines and 8 busy nodes.
  fixture f(eight_layers(), {.nodes = 6, .fault_tolerance = 1, .global_batch = 2, .microbatch = 1});
  cluster_state state{f.plan.pipelines, f.plan.idle_nodes};
  REQUIRE(state.pipelines.size() == 2);
  std::vector<node_id> joined;
  for (int id = 6; id < 16; ++id) joined.push_back(node_id{id});
  reconfiguration r;
  REQUIRE_NOTHROW(r = reconfigure(f.ctx(), state, {}, joined));
  REQUIRE(r.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(r) == std::vector<int>{4, 4});
  CHECK(r.idle_nodes.size() == 8);
  for (const auto& p : r.pipelines) CHECK(p.microbatches == 1);
  // Losing busy nodes afterwards puts idle ones to work.
  const auto again = reconfigure(f.ctx(), {r.pipelines, r.idle_nodes}, std::vector<node_id>{r.pipelines[0].nodes[3]}, {});
  REQUIRE(again.action == reconfiguration_action::continue_training);
  CHECK(sizes_of(again) == std::vector<int>{4, 4});
  CHECK(again.idle_nodes.size() == 7);
}

TEST_CASE("inputs no job produces are answered, never thrown or dereferenced") {
  fixture f(eight_layers(), {.nodes = 6, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  const cluster_state good{{pipe({0, 1, 2}, 3), pipe({3, 4, 5}, 3)}, {}};
  SUBCASE("a pipeline on a template the job does not have") {
    const cluster_state bad{{pipe({0, 1, 2}, 3), pipe({3, 4, 5, 6, 7, 8, 9}, 7)}, {}};
    const auto r = reconfigure(f.ctx(), bad, node_ids({0}), {});
    CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
    CHECK(r.reason.find("template of 7 nodes") != std::string::npos);
  }
  SUBCASE("a pipeline whose node count differs from its template's") {
    const cluster_state bad{{pipe({0, 1}, 3), pipe({3, 4, 5}, 3)}, {}};
    const auto r = reconfigure(f.ctx(), bad, {}, {});
    CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
    CHECK(r.reason.find("has 2 nodes for a template of 3") != std::string::npos);
  }
  SUBCASE("a node in two places") {
    const cluster_state bad{{pipe({0, 1, 2}, 3), pipe({3, 4, 5}, 3)}, node_ids({2})};
    const auto r = reconfigure(f.ctx(), bad, {}, {});
    CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
    CHECK(r.reason.find("node 2 is in two places") != std::string::npos);
  }
  SUBCASE("a loss reported twice and a join of a present node are no-ops") {
    const auto r = reconfigure(f.ctx(), good, node_ids({42}), node_ids({4, 6, 6}));
    REQUIRE(r.action == reconfiguration_action::continue_training);
    int used = 0;
    for (const auto& p : r.pipelines) used += static_cast<int>(p.nodes.size());
    CHECK(used + r.idle_nodes.size() == 7);  // 0..5 and 6 once
  }
  SUBCASE("fewer microbatches than f + 1 pipelines") {
    reconfiguration_context ctx = f.ctx();
    ctx.num_microbatches = 1;
    const auto r = reconfigure(ctx, good, {}, node_ids({6}));
    CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
    CHECK(r.reason.find("cannot feed f + 1 = 2 pipelines") != std::string::npos);
  }
  SUBCASE("no templates") {
    const template_set none;
    const reconfiguration_context ctx{none, f.costs, 1, 16, 1};
    const auto r = reconfigure(ctx, good, {}, {});
    CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
  }
}

TEST_CASE("stop when fewer than (f + 1) n0 nodes remain, or a layer lost every holder") {
  fixture f(eight_layers(), {.nodes = 4, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  cluster_state state{{pipe({0, 1}, 2), pipe({2, 3}, 2)}, {}};
  const std::vector<node_id> one = node_ids({0});
  auto r = reconfigure(f.ctx(), state, one, {});
  CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
  CHECK(r.reason.find("fewer than (f + 1) * n0 = 4") != std::string::npos);
  // Nodes 0 and 2 hold the same first layers in both pipelines: losing both loses layer 0.
  const std::vector<node_id> both = node_ids({0, 2});
  r = reconfigure(f.ctx(), state, both, node_ids({7, 8}));
  CHECK(r.action == reconfiguration_action::checkpoint_and_stop);
  CHECK(r.reason.find("no surviving copy") != std::string::npos);
}

TEST_CASE("reconfiguration properties over random failure and join sequences") {
  std::mt19937 rng(424242);
  int events = 0, stops = 0, replans = 0, capped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    // Half the jobs have few microbatches (B/b in f + 1 .. f + 4), so pipelines are capped by B/b
    // and large joins leave nodes idle.
    const bool small_batch = trial % 2 == 1;
    const int L = 6 + static_cast<int>(rng() % 10);
    const int M = 1 << (rng() % 2);
    auto prof = oobleck::testing::random_profile(rng, L, M);
    std::int64_t total = 0;
    for (const auto& l : prof.layers) total += l.param_bytes * 4 + l.activation_bytes * 3;
    prof.device_memory_bytes = total / (1 + static_cast<int>(rng() % 3)) / M + 200;  // n0 from 1 to ~3
    const int N = small_batch ? 2 + static_cast<int>(rng() % 7) : 6 + static_cast<int>(rng() % 11);
    const int f_tol = static_cast<int>(rng() % 3);
    const int batch = small_batch ? f_tol + 1 + static_cast<int>(rng() % 4) : 64;
    job_config job{.nodes = N, .fault_tolerance = f_tol, .global_batch = batch, .microbatch = 1};
    std::optional<fixture> fx;
    try {
      fx.emplace(prof, job);
    } catch (const planning_error&) {
      continue;  // f too large for this profile: refusal is tested elsewhere
    }
    const auto& templates = fx->plan.templates;
    const int n0 = fx->plan.spec.n0;
    cluster_state state{fx->plan.pipelines, fx->plan.idle_nodes};
    std::set<node_id> alive;
    for (int i = 0; i < N; ++i) alive.insert(node_id{i});
    int next_id = N;
    for (int step = 0; step < 12; ++step) {
      std::vector<node_id> lost, joined;
      if (rng() % 3 == 0) {
        const int k_max = rng() % 4 == 0 ? 12 : 3;
        for (int k = 1 + static_cast<int>(rng() % k_max); k > 0; --k) joined.push_back(node_id{next_id++});
      } else {
        std::vector<node_id> pool(alive.begin(), alive.end());
        std::shuffle(pool.begin(), pool.end(), rng);
        // Mostly <= f failures at once, sometimes more, so layer loss can happen too.
        const int k = 1 + static_cast<int>(rng() % (f_tol + (rng() % 4 == 0 ? 3 : 1)));
        lost.assign(pool.begin(), pool.begin() + std::min<int>(k, static_cast<int>(pool.size())));
      }
      const auto before = holdings_of(templates, state.pipelines);
      std::set<node_id> after_alive = alive;
      for (node_id n : lost) after_alive.erase(n);
      for (node_id n : joined) after_alive.insert(n);
      bool layer_lost = false;
      for (int l = 0; l < L; ++l) {
        bool held = false;
        for (const auto& [node, range] : before) held = held || (after_alive.count(node) && holds(before, node, l));
        layer_lost = layer_lost || !held;
      }
      const bool expect_stop = layer_lost || static_cast<int>(after_alive.size()) < (f_tol + 1) * n0;
      reconfiguration r;
      REQUIRE_NOTHROW(r = reconfigure(fx->ctx(), state, lost, joined));
      ++events;
      CAPTURE(trial);
      CAPTURE(step);
      REQUIRE((r.action == reconfiguration_action::checkpoint_and_stop) == expect_stop);
      if (static_cast<int>(lost.size()) <= f_tol && r.action == reconfiguration_action::checkpoint_and_stop)
        CHECK(!layer_lost);  // <= f failures never lose the last copy of a layer
      if (expect_stop) {
        ++stops;
        break;
      }
      REQUIRE(!r.rules.empty());
      if (r.rules.front() == reconfiguration_rule::replan) ++replans;
      // f + 1 to B/b pipelines, each on a template, nodes alive and used once.
      CHECK(static_cast<int>(r.pipelines.size()) >= f_tol + 1);
      CHECK(static_cast<int>(r.pipelines.size()) <= fx->plan.num_microbatches);
      std::set<node_id> used;
      int microbatches = 0;
      for (const auto& p : r.pipelines) {
        REQUIRE(templates.find(static_cast<int>(p.nodes.size())) != nullptr);
        CHECK(p.template_nodes == static_cast<int>(p.nodes.size()));
        CHECK(p.microbatches >= 1);
        microbatches += p.microbatches;
        for (node_id n : p.nodes) {
          CHECK(after_alive.count(n) == 1);
          CHECK(used.insert(n).second);
        }
      }
      CHECK(microbatches == fx->plan.num_microbatches);
      for (node_id n : r.idle_nodes) CHECK(used.count(n) == 0);
      CHECK(used.size() + r.idle_nodes.size() == after_alive.size());
      // As many nodes are used as f + 1 to B/b pipelines can use; every one when that covers them.
      const int a = static_cast<int>(after_alive.size());
      const int usable = most_usable(templates.sizes(), f_tol + 1, fx->plan.num_microbatches, a);
      CHECK(static_cast<int>(used.size()) == usable);
      if (usable < a) ++capped;
      // Copies come from surviving holders; afterwards every node holds what its stages need.
      std::map<node_id, std::set<int>> have;
      for (const auto& [node, range] : before)
        for (int l = range.first; l < range.second; ++l) have[node].insert(l);
      for (const auto& c : r.copies) {
        CHECK(after_alive.count(c.from_node) == 1);
        CHECK(holds(before, c.from_node, c.layer.value));
        CHECK(c.bytes == layer_copy_bytes(fx->costs, c.layer));
        have[c.to_node].insert(c.layer.value);
      }
      for (const auto& [node, range] : holdings_of(templates, r.pipelines))
        for (int l = range.first; l < range.second; ++l) CHECK(have[node].count(l) == 1);
      alive = after_alive;
      state = {r.pipelines, r.idle_nodes};
    }
  }
  CHECK(events > 600);
  CHECK(stops > 60);
  CHECK(capped > 30);
  MESSAGE("events " << events << ", stops " << stops << ", global re-plans " << replans
                    << ", events leaving nodes idle " << capped);
}

TEST_CASE("predicted steps add the synchronisation of the slowest node to the slowest pipeline") {
  auto p = eight_layers();
  for (int l = 0; l < 8; ++l) {
    p.layers[l].optimizer_ms = 0.25 * (l + 1);
    p.layers[l].output_bytes = 64;
  }
  p.link = {0.125, 100};  // a message of b bytes: 0.125 + b / 100 ms
  fixture f(p, {.nodes = 7, .fault_tolerance = 1, .global_batch = 16, .microbatch = 1});
  double slowest_pipeline = 0, slowest_node = 0;
  const int holders = static_cast<int>(f.plan.pipelines.size());
  for (const auto& pl : f.plan.pipelines) {
    slowest_pipeline = std::max(slowest_pipeline, pl.time_ms);
    const auto* t = f.plan.templates.find(pl.template_nodes);
    for (int i = 0; i < t->nodes; ++i) {
      const auto [u, v] = t->node_layers(i);
      double node = 0;
      for (int l = u.value; l < v.value; ++l)  // ring: 2 (g - 1) messages of ceil(100 / g) bytes, then AdamW
        node += 2.0 * (holders - 1) * (0.125 + ((100 + holders - 1) / holders) / 100.0) + p.layers[l].optimizer_ms;
      slowest_node = std::max(slowest_node, node);
    }
  }
  REQUIRE(holders >= 2);
  CHECK(slowest_node > 0);
  CHECK(f.plan.step_ms == doctest::Approx(slowest_pipeline + slowest_node));
  CHECK(synchronisation_ms(f.costs, f.plan.templates, f.plan.pipelines) == doctest::Approx(slowest_node));

  const cluster_state state{f.plan.pipelines, f.plan.idle_nodes};
  const auto r = reconfigure(f.ctx(), state, std::vector<node_id>{f.plan.pipelines[0].nodes[0]}, {});
  REQUIRE(r.action == reconfiguration_action::continue_training);
  double rslowest = 0;
  for (const auto& pl : r.pipelines) rslowest = std::max(rslowest, pl.time_ms);
  CHECK(r.step_ms == doctest::Approx(rslowest + synchronisation_ms(f.costs, f.plan.templates, r.pipelines)));
  CHECK(r.step_ms > rslowest);
}
