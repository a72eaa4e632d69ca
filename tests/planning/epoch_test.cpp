#include "planning/epoch.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <type_traits>

#include "planning/holdings.hpp"
#include "support/brute_force.hpp"

using namespace oobleck::planning;

// Node ids, ranks and layer indices do not mix, and nothing converts into them implicitly.
static_assert(!std::is_convertible_v<int, node_id> && !std::is_convertible_v<int, rank> &&
              !std::is_convertible_v<int, layer_index>);
static_assert(!std::is_convertible_v<node_id, rank> && !std::is_convertible_v<rank, node_id>);
static_assert(!std::is_convertible_v<rank, layer_index> && !std::is_convertible_v<layer_index, rank>);
static_assert(!std::is_convertible_v<node_id, int> && !std::is_convertible_v<rank, int>);
static_assert(!std::is_invocable_v<decltype(&epoch::holders), const epoch&, rank>);
static_assert(!std::is_invocable_v<decltype(&epoch::stages), const epoch&, node_id>);
static_assert(!std::is_invocable_v<decltype(&epoch::rank_of), const epoch&, rank>);

namespace {

/// 8 layers of 100 parameter bytes, M GPUs per node; with 2000 bytes per GPU a stage holds at
/// most 5 layers (n0 = 2 for M = 1).
profile eight_layers(int gpus_per_node) {
  profile p;
  p.model = "eight";
  p.microbatch_size = 1;
  p.gpus_per_node = gpus_per_node;
  p.device_memory_bytes = 2000;
  for (int l = 0; l < 8; ++l) {
    layer_profile layer{"l" + std::to_string(l), {}, {}, 100, 10};
    // Wider stages are slower (overhead, no speed-up): templates split nodes into one-GPU stages.
    for (int d = 1; d <= gpus_per_node; d *= 2) layer.forward_ms.push_back(d), layer.backward_ms.push_back(2.0 * d);
    p.layers.push_back(layer);
  }
  return p;
}

using holding = std::map<node_id, std::pair<int, int>>;  // node -> layers [u, v)
using oobleck::testing::holdings_of;

bool holds(const holding& h, std::int64_t node, int layer) {
  auto it = h.find(node_id{node});
  return it != h.end() && layer >= it->second.first && layer < it->second.second;
}

/// Every property ARCHITECTURE.md §4 asks of an epoch, against the plan it maps and the holdings before.
void check_epoch(const epoch& e, const template_set& templates, const std::vector<pipeline_instance>& pipelines,
                 const std::vector<layer_copy>& copies, const holding& before, const std::set<int>& alive,
                 int num_layers, int gpus_per_node) {
  // Dense ranks 0..R-1, one per node in use, each node once.
  std::set<node_id> seen;
  for (int r = 0; r < e.num_ranks(); ++r) {
    const node_id n = e.node(rank{r});
    CHECK(seen.insert(n).second);
    REQUIRE(e.rank_of(n).has_value());
    CHECK(*e.rank_of(n) == rank{r});
  }
  // Pipeline nodes take ranks first, in pipeline and stage order; then copy-only senders.
  REQUIRE(e.pipelines().size() == pipelines.size());
  int next = 0;
  for (std::size_t p = 0; p < pipelines.size(); ++p) {
    REQUIRE(e.pipelines()[p].ranks.size() == pipelines[p].nodes.size());
    CHECK(e.pipelines()[p].microbatches == pipelines[p].microbatches);
    for (std::size_t i = 0; i < pipelines[p].nodes.size(); ++i) {
      CHECK(e.pipelines()[p].ranks[i] == rank{next++});
      CHECK(e.node(e.pipelines()[p].ranks[i]) == node_id{pipelines[p].nodes[i]});
    }
  }
  std::set<node_id> senders;
  for (const auto& c : copies) senders.insert(node_id{c.from_node});
  for (int r = next; r < e.num_ranks(); ++r) {
    CHECK(e.stages(rank{r}).empty());
    CHECK(senders.count(e.node(rank{r})) == 1);
  }
  // Stages: each pipeline's stages cover the layers in order; neighbours and GPUs line up.
  std::vector<std::set<rank>> expected_holders(num_layers);
  for (std::size_t p = 0; p < pipelines.size(); ++p) {
    std::vector<std::pair<stage_assignment, rank>> stages;
    for (rank r : e.pipelines()[p].ranks) {
      int gpus = 0;
      for (const auto& s : e.stages(r)) {
        CHECK(s.pipeline == static_cast<int>(p));
        CHECK(s.first_gpu == gpus);
        gpus += s.gpus;
        stages.push_back({s, r});
      }
      CHECK(gpus == gpus_per_node);
    }
    const auto* t = templates.find(pipelines[p].template_nodes);
    REQUIRE(stages.size() == t->stages.size());
    for (std::size_t k = 0; k < stages.size(); ++k) {
      const auto& [s, r] = stages[k];
      CHECK(s.stage == static_cast<int>(k));
      CHECK(s.num_stages == static_cast<int>(stages.size()));
      CHECK(s.first_layer == layer_index{k == 0 ? 0 : stages[k - 1].first.end_layer.value});
      CHECK(s.end_layer > s.first_layer);
      CHECK(s.prev == (k == 0 ? std::nullopt : std::optional<rank>(stages[k - 1].second)));
      CHECK(s.next == (k + 1 == stages.size() ? std::nullopt : std::optional<rank>(stages[k + 1].second)));
      for (int l = s.first_layer.value; l < s.end_layer.value; ++l) expected_holders[l].insert(r);
    }
    CHECK(stages.back().first.end_layer == layer_index{num_layers});
  }
  // Every layer's gradient group: one holder per pipeline, at least one.
  REQUIRE(e.num_layers() == num_layers);
  for (int l = 0; l < num_layers; ++l) {
    const auto& h = e.holders(layer_index{l});
    CHECK(!h.empty());
    CHECK(h.size() == pipelines.size());
    CHECK(std::is_sorted(h.begin(), h.end()));
    CHECK(std::set<rank>(h.begin(), h.end()) == expected_holders[l]);
  }
  // Copies: from a surviving holder of the layer, to a rank that holds it now and did not before;
  // afterwards every rank has every layer of its stages.
  REQUIRE(e.copies().size() == copies.size());
  std::set<std::pair<int, int>> received;  // (node, layer)
  for (const auto& c : e.copies()) {
    const int from = e.node(c.from).value, to = e.node(c.to).value;
    CHECK(alive.count(from) == 1);
    CHECK(holds(before, from, c.layer.value));
    CHECK(!holds(before, to, c.layer.value));
    const auto& h = e.holders(c.layer);
    CHECK(std::find(h.begin(), h.end(), c.to) != h.end());
    CHECK(received.insert({to, c.layer.value}).second);
  }
  for (int l = 0; l < num_layers; ++l)
    for (rank r : e.holders(layer_index{l})) {
      const int n = e.node(r).value;
      CHECK((holds(before, n, l) || received.count({n, l}) == 1));
    }
}

struct job {
  profile prof;
  job_plan plan;
  layer_costs costs;
  int f;
  job(profile p, job_config config)
      : prof(std::move(p)), plan(plan_job(prof, config)), costs(prof, job_memory(prof, config)), f(config.fault_tolerance) {}
  reconfiguration_context ctx() const { return {plan.templates, costs, f, plan.num_microbatches, 1}; }
};

}  // namespace

TEST_CASE("the first epoch: ranks in pipeline and stage order, every layer's holders, no copies") {
  job j(eight_layers(2), {.nodes = 4, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const epoch e = map_epoch(j.plan);
  CHECK(e.num_ranks() == 4);
  CHECK(e.copies().empty());
  std::set<int> alive{0, 1, 2, 3};
  check_epoch(e, j.plan.templates, j.plan.pipelines, {}, holdings_of(j.plan.templates, j.plan.pipelines), alive, 8, 2);
  // Two GPUs per node: a node may run two stages, whose neighbour is then the node itself.
  bool same_node_neighbour = false;
  for (int r = 0; r < e.num_ranks(); ++r)
    for (const auto& s : e.stages(rank{r})) same_node_neighbour = same_node_neighbour || s.next == rank{r};
  CHECK(same_node_neighbour);
}

TEST_CASE("ranks are renumbered when the node with rank 0 dies, node ids stay") {
  job j(eight_layers(1), {.nodes = 6, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const epoch first = map_epoch(j.plan);
  const node_id zero = first.node(rank{0});
  const cluster_state state{j.plan.pipelines, j.plan.idle_nodes};
  const std::vector<node_id> lost{zero};
  const auto r = reconfigure(j.ctx(), state, lost, {});
  REQUIRE(r.action == reconfiguration_action::continue_training);
  const epoch second = map_epoch(j.plan.templates, r);
  CHECK(!second.rank_of(zero).has_value());
  CHECK(second.num_ranks() == 5);
  CHECK(second.node(rank{0}) != zero);
  for (int n = 1; n < 6; ++n) CHECK(second.rank_of(node_id{n}).has_value());
  check_epoch(second, j.plan.templates, r.pipelines, r.copies, holdings_of(j.plan.templates, j.plan.pipelines),
              {1, 2, 3, 4, 5}, 8, 1);
}

TEST_CASE("a copy source that runs no stage this epoch still gets a rank, after the others") {
  // The policy rarely idles a holder, but a source idle in the new configuration must still send.
  job j(eight_layers(1), {.nodes = 4, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const std::vector<pipeline_instance> pipelines{{node_ids({0, 1}), 2, 4, 0}, {node_ids({2, 3}), 2, 4, 0}};
  const std::vector<layer_copy> copies{{layer_index{0}, node_id{9}, node_id{2}, 400}, {layer_index{7}, node_id{5}, node_id{1}, 400}, {layer_index{1}, node_id{9}, node_id{0}, 400}};
  const epoch e = map_epoch(j.plan.templates, pipelines, copies);
  REQUIRE(e.num_ranks() == 6);
  CHECK(e.node(rank{4}) == node_id{5});  // senders by node id
  CHECK(e.node(rank{5}) == node_id{9});
  CHECK(e.stages(rank{4}).empty());
  CHECK(e.copies()[0] == epoch_copy{layer_index{0}, rank{5}, rank{2}, 400});
  CHECK(e.copies()[1] == epoch_copy{layer_index{7}, rank{4}, rank{1}, 400});
  CHECK(e.holders(layer_index{0}) == std::vector<rank>{rank{0}, rank{2}});
}

TEST_CASE("p2p_links: both ways between neighbouring ranks and a pipeline's ends, and each copy's source to its target") {
  // Pipelines of 3 and 2 nodes (M = 1: every stage on a node of its own), copies from an idle sender.
  job j(eight_layers(1), {.nodes = 5, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const std::vector<pipeline_instance> pipelines{{node_ids({0, 1, 2}), 3, 4, 0}, {node_ids({3, 4}), 2, 4, 0}};
  const std::vector<layer_copy> copies{{layer_index{0}, node_id{9}, node_id{3}, 400}, {layer_index{1}, node_id{9}, node_id{3}, 400},
                                       {layer_index{7}, node_id{0}, node_id{4}, 400}};
  const epoch e = map_epoch(j.plan.templates, pipelines, copies);
  REQUIRE(e.num_ranks() == 6);
  auto l = [](int from, int to) { return rank_link{rank{from}, rank{to}}; };
  // Ranks 0-1-2 (ends 0 and 2), 3-4; rank 5 (node 9) sends two layers to rank 3 (one link), rank 0 one to rank 4.
  const std::vector<rank_link> expected{l(0, 1), l(0, 2), l(0, 4), l(1, 0), l(1, 2), l(2, 0), l(2, 1), l(3, 4), l(4, 3), l(5, 3)};
  CHECK(p2p_links(e) == expected);

  // Two GPUs per node: a node's two stages hand over in memory, so no link to itself.
  job wide(eight_layers(2), {.nodes = 4, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const std::vector<pipeline_instance> two_nodes{{node_ids({0, 1}), 2, 4, 0}, {node_ids({2, 3}), 2, 4, 0}};
  const epoch w = map_epoch(wide.plan.templates, two_nodes, {});
  const auto links = p2p_links(w);
  CHECK(links.size() == 4);  // 0 <-> 1 and 2 <-> 3, whatever the stages within each node
  CHECK(std::is_sorted(links.begin(), links.end()));
  CHECK(std::adjacent_find(links.begin(), links.end()) == links.end());
  for (const auto& k : links) CHECK(k.from != k.to);
  for (int r = 0; r < w.num_ranks(); ++r)
    for (const auto& s : w.stages(rank{r}))
      if (s.next && *s.next != rank{r}) {
        CHECK(std::find(links.begin(), links.end(), rank_link{rank{r}, *s.next}) != links.end());
        CHECK(std::find(links.begin(), links.end(), rank_link{*s.next, rank{r}}) != links.end());
      }
}

TEST_CASE("epoch mapping refuses input no plan produces") {
  job j(eight_layers(1), {.nodes = 4, .fault_tolerance = 1, .global_batch = 8, .microbatch = 1});
  const std::vector<pipeline_instance> unknown{{node_ids({0, 1, 2, 3, 4, 5, 6}), 7, 1, 0}};
  CHECK_THROWS_AS(map_epoch(j.plan.templates, unknown, {}), std::invalid_argument);
  const std::vector<pipeline_instance> twice{{node_ids({0, 1}), 2, 1, 0}, {node_ids({1, 2}), 2, 1, 0}};
  CHECK_THROWS_AS(map_epoch(j.plan.templates, twice, {}), std::invalid_argument);
  const std::vector<pipeline_instance> ok{{node_ids({0, 1}), 2, 1, 0}, {node_ids({2, 3}), 2, 1, 0}};
  const std::vector<layer_copy> to_non_holder{{layer_index{7}, node_id{3}, node_id{0}, 1}};  // node 0 runs the first stage only
  CHECK_THROWS_AS(map_epoch(j.plan.templates, ok, to_non_holder), std::invalid_argument);
  const std::vector<layer_copy> no_layer{{layer_index{8}, node_id{3}, node_id{1}, 1}};
  CHECK_THROWS_AS(map_epoch(j.plan.templates, ok, no_layer), std::invalid_argument);
  reconfiguration stopped;
  stopped.action = reconfiguration_action::checkpoint_and_stop;
  CHECK_THROWS_AS(map_epoch(j.plan.templates, stopped), std::invalid_argument);
}

TEST_CASE("epoch properties over random failure and join sequences") {
  std::mt19937 rng(2024);
  int epochs = 0, with_copies = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 6 + static_cast<int>(rng() % 10);
    const int M = 1 << (rng() % 3);
    auto prof = oobleck::testing::random_profile(rng, L, M);
    std::int64_t total = 0;
    for (const auto& l : prof.layers) total += l.param_bytes * 4 + l.activation_bytes * 3;
    prof.device_memory_bytes = total / (1 + static_cast<int>(rng() % 3)) / M + 200;
    const int N = 3 + static_cast<int>(rng() % 12);
    const int f = static_cast<int>(rng() % 3);
    const int batch = trial % 2 ? f + 1 + static_cast<int>(rng() % 4) : 32;
    std::optional<job> j;
    try {
      j.emplace(prof, job_config{.nodes = N, .fault_tolerance = f, .global_batch = batch, .microbatch = 1});
    } catch (const planning_error&) {
      continue;
    }
    const auto& templates = j->plan.templates;
    std::set<int> alive;
    for (int i = 0; i < N; ++i) alive.insert(i);
    CAPTURE(trial);
    check_epoch(map_epoch(j->plan), templates, j->plan.pipelines, {}, holdings_of(templates, j->plan.pipelines),
                alive, L, M);
    cluster_state state{j->plan.pipelines, j->plan.idle_nodes};
    int next_id = N;
    for (int step = 0; step < 10; ++step) {
      std::vector<node_id> lost, joined;
      if (rng() % 3 == 0) {
        for (int k = 1 + static_cast<int>(rng() % 6); k > 0; --k) joined.push_back(node_id{next_id++});
      } else {
        auto pool = node_ids(alive);
        std::shuffle(pool.begin(), pool.end(), rng);
        lost.assign(pool.begin(), pool.begin() + std::min<int>(1 + static_cast<int>(rng() % (f + 1)), pool.size()));
      }
      const auto r = reconfigure(j->ctx(), state, lost, joined);
      if (r.action == reconfiguration_action::checkpoint_and_stop) break;
      for (node_id n : lost) alive.erase(static_cast<int>(n.value));
      for (node_id n : joined) alive.insert(static_cast<int>(n.value));
      CAPTURE(step);
      const epoch e = map_epoch(templates, r);
      check_epoch(e, templates, r.pipelines, r.copies, holdings_of(templates, state.pipelines), alive, L, M);
      CHECK(map_epoch(templates, r) == e);  // deterministic
      ++epochs;
      if (!r.copies.empty()) ++with_copies;
      state = {r.pipelines, r.idle_nodes};
    }
  }
  CHECK(epochs > 500);
  CHECK(with_copies > 100);
  MESSAGE("epochs " << epochs << ", with copies " << with_copies);
}
