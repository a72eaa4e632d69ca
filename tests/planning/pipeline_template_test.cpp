#include "planning/pipeline_template.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "support/brute_force.hpp"

using namespace oobleck::planning;
using oobleck::testing::brute_force_best_time;
using oobleck::testing::random_profile;

namespace {

// Structural invariants every template must satisfy (DESIGN §4).
void check_layout(const pipeline_template& t, const layer_costs& costs) {
  const int L = costs.num_layers();
  const int M = costs.gpus_per_node();
  const int S = static_cast<int>(t.stages.size());
  REQUIRE(S >= t.nodes);
  REQUIRE(S <= std::min(L, t.nodes * M));
  int layer = 0, gpu = 0;
  for (int k = 0; k < S; ++k) {
    const auto& s = t.stages[k];
    CHECK(s.first_layer == layer);
    CHECK(s.end_layer > s.first_layer);
    CHECK(is_power_of_two(s.gpus));
    CHECK(s.node == gpu / M);
    CHECK(gpu % M + s.gpus <= M);  // never crosses a node
    CHECK(costs.stage_fits(s.first_layer, s.end_layer, s.gpus, S - k));
    CHECK(s.ms == costs.stage_ms(s.first_layer, s.end_layer, s.gpus));
    layer = s.end_layer;
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
