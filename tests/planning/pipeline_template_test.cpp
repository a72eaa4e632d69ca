#include "planning/pipeline_template.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "support/brute_force.hpp"

using namespace oobleck::planning;
using oobleck::testing::brute_force_best_time;
using oobleck::testing::random_profile;

namespace {

// Structural invariants every template must satisfy (ARCHITECTURE.md §4).
void check_layout(const pipeline_template& t, const layer_costs& costs) {
  const int L = costs.num_layers();
  const int M = costs.gpus_per_node();
  const int S = static_cast<int>(t.stages.size());
  REQUIRE(S >= t.nodes);
  REQUIRE(S <= std::min(L, t.nodes * M));
  int layer = 0, gpu = 0;
  for (int k = 0; k < S; ++k) {
    const auto& s = t.stages[k];
    CHECK(s.first_layer == layer_index{layer});
    CHECK(s.end_layer > s.first_layer);
    CHECK(is_power_of_two(s.gpus));
    CHECK(s.node == gpu / M);
    CHECK(gpu % M + s.gpus <= M);  // never crosses a node
    CHECK(costs.stage_fits(s.first_layer, s.end_layer, s.gpus, S - k));
    CHECK(s.ms == costs.stage_ms(s.first_layer, s.end_layer, s.gpus));
    layer = s.end_layer.value;
    gpu += s.gpus;
  }
  CHECK(layer == L);
  CHECK(gpu == t.nodes * M);
  CHECK(t.iteration_ms == ranking_time(t.stage_ms()));
}

}  // namespace

TEST_CASE("template generator equals brute force on random small instances") {
  std::mt19937 rng(20231023);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 8);
    const int M = 1 << (rng() % 3);
    const int n = 1 + static_cast<int>(rng() % 3);
    auto p = random_profile(rng, L, M);
    // Memory limits from very tight to unlimited, so both outcomes occur.
    p.device_memory_bytes = 50 + static_cast<std::int64_t>(rng() % 2000);
    const layer_costs costs(p, {static_cast<double>(p.device_memory_bytes), 4.0});
    template_generator gen(costs);
    const auto expected = brute_force_best_time(costs, n);
    const auto got = gen.generate(n);
    CAPTURE(trial);
    CAPTURE(L);
    CAPTURE(M);
    CAPTURE(n);
    REQUIRE(got.has_value() == expected.has_value());
    if (!got) {
      ++infeasible;
      continue;
    }
    ++feasible;
    CHECK(got->iteration_ms == doctest::Approx(*expected).epsilon(1e-12));
    check_layout(*got, costs);
  }
  CHECK(feasible > 100);
  CHECK(infeasible > 20);
}

TEST_CASE("generating a range of node counts equals generating each alone") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 4 + static_cast<int>(rng() % 9);
    const int M = 1 << (rng() % 3);
    auto p = random_profile(rng, L, M);
    p.device_memory_bytes = 400 + static_cast<std::int64_t>(rng() % 3000);
    const layer_costs costs(p, {static_cast<double>(p.device_memory_bytes), 4.0});
    template_generator gen(costs);
    const int hi = std::min(L, 5);
    const auto all = gen.generate(1, hi);
    for (int n = 1; n <= hi; ++n) {
      const auto one = gen.generate(n);
      CAPTURE(trial);
      CAPTURE(n);
      REQUIRE(one.has_value() == all[n - 1].has_value());
      if (one) CHECK(one->iteration_ms == doctest::Approx(all[n - 1]->iteration_ms).epsilon(1e-12));
    }
  }
}

TEST_CASE("with a link, a stage's ops are charged for receiving from another node, never from its own") {
  // 2 slots per node, so a template of 2 nodes may put two stages on one node.
  profile p;
  p.model = "toy";
  p.microbatch_size = 1;
  p.gpus_per_node = 2;
  p.device_memory_bytes = 1 << 30;
  for (int l = 0; l < 6; ++l)
    p.layers.push_back({"l" + std::to_string(l), {1.0 + l, 0.75 + l}, {2.0 + l, 1.5 + l}, 100, 10, 1000 * (l + 1), 0});
  p.link = {0.5, 1000};  // a message of l's output: 0.5 + (l + 1) ms
  const layer_costs costs(p, {static_cast<double>(p.device_memory_bytes), 4.0});
  const std::vector<stage_spec> stages{{0, 1, 0, 2, 0, costs.forward_ms(layer_index{0}, layer_index{2}, 1), costs.backward_ms(layer_index{0}, layer_index{2}, 1)},
                                       {0, 1, 2, 3, 0, costs.forward_ms(layer_index{2}, layer_index{3}, 1), costs.backward_ms(layer_index{2}, layer_index{3}, 1)},
                                       {1, 2, 3, 6, 0, costs.forward_ms(layer_index{3}, layer_index{6}, 2), costs.backward_ms(layer_index{3}, layer_index{6}, 2)}};
  // Stage 0 -> 1: same node, free. Stage 1 -> 2: layer 2's output, 0.5 + 3 ms, charged to the
  // forward of stage 2 and to the backward of stage 1.
  const std::vector<double> f{stages[0].forward_ms, stages[1].forward_ms, stages[2].forward_ms + 3.5};
  const std::vector<double> b{stages[0].backward_ms, stages[1].backward_ms + 3.5, stages[2].backward_ms};
  const auto t = predicted_time(costs, stages);
  for (int nb : {1, 2, 3, 5, 8, 40})
    CHECK(t.at(nb) == doctest::Approx(oobleck::testing::simulate_1f1b(f, b, nb)).epsilon(1e-12));
  // Without a link the prediction is the compute's makespan, as before link costs existed.
  p.link = {};
  const layer_costs free_costs(p, {static_cast<double>(p.device_memory_bytes), 4.0});
  const auto plain = predicted_time(free_costs, stages);
  const std::vector<double> f0{stages[0].forward_ms, stages[1].forward_ms, stages[2].forward_ms};
  const std::vector<double> b0{stages[0].backward_ms, stages[1].backward_ms, stages[2].backward_ms};
  for (int nb : {1, 4, 12}) CHECK(plain.at(nb) == doctest::Approx(oobleck::testing::simulate_1f1b(f0, b0, nb)));
  CHECK(t.at(8) > plain.at(8));
}

TEST_CASE("generated templates predict with the link, and rank on compute alone") {
  std::mt19937 rng(7);
  auto p = random_profile(rng, 8, 1);
  for (auto& l : p.layers) l.output_bytes = 4096;
  const layer_costs free_costs(p, {1e18, 4.0});
  p.link = {0.25, 4096};  // 1.25 ms per message
  const layer_costs costs(p, {1e18, 4.0});
  template_generator with_link(costs), without(free_costs);
  for (int n = 1; n <= 4; ++n) {
    const auto a = with_link.generate(n), b = without.generate(n);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->iteration_ms == b->iteration_ms);  // the same layout: ranking ignores the link
    std::vector<double> f, bw;
    for (const auto& s : a->stages) {
      f.push_back(s.forward_ms + (s.node > 0 ? 1.25 : 0));
      bw.push_back(s.backward_ms + (s.node + 1 < a->nodes ? 1.25 : 0));
    }
    for (int nb : {1, 3, 16}) CHECK(a->time_ms(nb) == doctest::Approx(oobleck::testing::simulate_1f1b(f, bw, nb)));
  }
}
