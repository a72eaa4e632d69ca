#include "planning/makespan.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <random>

#include "planning/cost_model.hpp"
#include "planning/planner.hpp"
#include "support/brute_force.hpp"

using namespace oobleck::planning;
using oobleck::testing::simulate_1f1b;

namespace {

double sum(const std::vector<double>& xs) { return std::accumulate(xs.begin(), xs.end(), 0.0); }

std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> w(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) w[i] = a[i] + b[i];
  return w;
}

/// Microbatch counts to compare at: all small ones (table, both of its parts, and the switch to
/// lines) and some far out (lines only).
std::vector<int> counts(int stages) {
  std::vector<int> m;
  for (int n = 1; n <= 12 * stages + 12; ++n) m.push_back(n);
  for (int n : {257, 1000}) m.push_back(n);
  return m;
}

}  // namespace

TEST_CASE("predicted time equals an event simulation of the 1F1B op lists") {
  std::mt19937 rng(7);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 6);
    std::vector<double> f(S), b(S);
    if (trial % 2 == 0) {
      for (int s = 0; s < S; ++s) f[s] = rng() % 10, b[s] = rng() % 10;  // zeros and ties included
    } else {
      // Nearly equal stages: the bottleneck takes over only after a long transient.
      const int base = 5 + static_cast<int>(rng() % 15);
      for (int s = 0; s < S; ++s) f[s] = base + static_cast<int>(rng() % 3) - 1, b[s] = 2 * base + static_cast<int>(rng() % 3) - 1;
    }
    const auto t = pipeline_time::one_f_one_b(f, b);
    CAPTURE(trial);
    for (int m : counts(S)) {
      CAPTURE(m);
      REQUIRE(t.at(m) == simulate_1f1b(f, b, m));  // small integers: exact in double
      ++compared;
    }
  }
  CHECK(compared > 10000);
}

TEST_CASE("predicted time: a long transient before the bottleneck stage sets the pace") {
  // w = [15, 1, 9, 8, 10, 14]: for ~40 microbatches a path that dwells on the last stage (14 per
  // microbatch, larger fixed part) is the longest; only then does stage 0 (15) take over.
  const std::vector<double> f{8, 1, 2, 8, 6, 5}, b{7, 0, 7, 0, 4, 9};
  const auto t = pipeline_time::one_f_one_b(f, b);
  for (int m = 1; m <= 400; ++m) REQUIRE(t.at(m) == simulate_1f1b(f, b, m));
  CHECK(t.at(30) - t.at(29) == 14);
  CHECK(t.at(400) - t.at(399) == 15);
}

TEST_CASE("predicted time keeps growing past its table when many stages take the same real-valued time") {
  // A 26-stage GPT layout (embedding, 24 equal blocks, head) with times that are not integers:
  // rounding in the lines' intercepts once dropped every line, so T(Nb) stayed at T(6S + 4) for
  // every larger Nb (74 s instead of 205 s for 484 microbatches).
  std::vector<double> f(26, 100.8423307554989), b(26, 302.52699226649673);
  f[0] = 0.8264638423645321, b[0] = 1.6529276847290642;
  f[25] = 92.99697182117647, b[25] = 278.9909154635294;
  const auto t = pipeline_time::one_f_one_b(f, b);
  for (int m : {150, 160, 170, 200, 484, 1000}) {
    CAPTURE(m);
    CHECK(t.at(m) == doctest::Approx(simulate_1f1b(f, b, m)).epsilon(1e-12));
  }
  CHECK(t.at(484) > 200000);
}

TEST_CASE("predicted time with real-valued stages: simulation within rounding, bounds, monotone") {
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> ms(0.0, 10.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 8);
    std::vector<double> f(S), b(S);
    for (int s = 0; s < S; ++s) f[s] = ms(rng), b[s] = ms(rng);
    const auto w = add(f, b);
    const double w_max = *std::max_element(w.begin(), w.end());
    const auto t = pipeline_time::one_f_one_b(f, b);
    CAPTURE(trial);
    double previous = 0;
    for (int m : counts(S)) {
      CAPTURE(m);
      const double got = t.at(m);
      CHECK(got == doctest::Approx(simulate_1f1b(f, b, m)).epsilon(1e-12));
      CHECK(got >= previous);                                    // nondecreasing in Nb
      CHECK(got >= sum(w) * (1 - 1e-12));                        // one microbatch's trip
      CHECK(got >= m * w_max * (1 - 1e-12));                     // the bottleneck's work
      previous = got;
    }
  }
}

TEST_CASE("fewer microbatches than stages: never shorter than one microbatch's trip") {
  // ARCHITECTURE.md §4's example: the closed form gives -14 for w = [10, 1, 1, 1] and Nb = 1.
  const std::vector<double> f{4, 0.5, 0.5, 0.5}, b{6, 0.5, 0.5, 0.5};
  const std::vector<double> w{10, 1, 1, 1};
  CHECK(iteration_time(w, 1) == -14);  // the ranking objective, not a prediction
  const auto t = pipeline_time::one_f_one_b(f, b);
  CHECK(t.at(1) == 13);  // forward down, backward up
  CHECK(t.at(2) == 22);  // stage 0 runs F0 F1 (8), waits for B0 until 10, then B0 B1
  for (int m = 1; m < 4; ++m) CHECK(t.at(m) == simulate_1f1b(f, b, m));
}

TEST_CASE("most_below is the largest count finishing strictly before a limit") {
  const auto t = pipeline_time::one_f_one_b(std::vector<double>{1, 2, 3}, std::vector<double>{2, 2, 2});
  for (double limit : {0.0, 5.0, 14.0, 14.5, 15.0, 100.0, 1e4}) {
    const int n = t.most_below(limit, 500);
    CAPTURE(limit);
    if (n > 0) CHECK(t.at(n) < limit);
    if (n < 500) CHECK(t.at(n + 1) >= limit);
  }
  CHECK(pipeline_time::linear(4, 2).at(3) == 10);
  CHECK(pipeline_time::linear(4, 2).most_below(10, 100) == 2);
}

TEST_CASE("a job with fewer microbatches per pipeline than stages predicts at least one trip each") {
  // 8 layers of 1 + 2 ms; 100 parameter bytes each, 2000 bytes per node: n0 = 2 (ARCHITECTURE.md §4).
  profile p;
  p.model = "eight";
  p.microbatch_size = 1;
  p.gpus_per_node = 1;
  p.device_memory_bytes = 2000;
  for (int l = 0; l < 8; ++l) p.layers.push_back({"l" + std::to_string(l), {1.0}, {2.0}, 100, 0});
  // 8 nodes, f = 0, 2 microbatches: two pipelines of 4 stages, one microbatch each.
  const auto plan = plan_job(p, {.nodes = 8, .fault_tolerance = 0, .global_batch = 2, .microbatch = 1});
  REQUIRE(!plan.pipelines.empty());
  for (const auto& pipe : plan.pipelines) {
    const auto* t = plan.templates.find(pipe.template_nodes);
    REQUIRE(t != nullptr);
    std::vector<double> f, b;
    for (const auto& s : t->stages) f.push_back(s.forward_ms), b.push_back(s.backward_ms);
    CHECK(pipe.time_ms >= sum(t->stage_ms()));
    CHECK(pipe.time_ms == simulate_1f1b(f, b, pipe.microbatches));
    CHECK(plan.step_ms >= pipe.time_ms);
  }
  // Every layer costs 3 ms, so any pipeline's trip is 24 ms.
  CHECK(plan.step_ms >= 24);
}

TEST_CASE("the makespan of one measured step: per-op times, simulated op by op") {
  using oobleck::planning::one_f_one_b_makespan;
  using oobleck::planning::pipeline_time;
  // Uniform times per stage: the same as the planner's closed form, for every S and m.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> ms(0.1, 3.0);
  for (int S = 1; S <= 5; ++S)
    for (int m = 1; m <= 9; ++m) {
      std::vector<double> f(S), b(S);
      for (int s = 0; s < S; ++s) f[s] = ms(rng), b[s] = ms(rng);
      std::vector<std::vector<double>> F(S), B(S);
      for (int s = 0; s < S; ++s) F[s].assign(m, f[s]), B[s].assign(m, b[s]);
      CAPTURE(S);
      CAPTURE(m);
      CHECK(one_f_one_b_makespan(F, B) == doctest::Approx(pipeline_time::one_f_one_b(f, b).at(m)));
    }
  // One stage: every op in turn.
  CHECK(one_f_one_b_makespan({{1, 2, 3}}, {{4, 5, 6}}) == doctest::Approx(21));
  // Two stages, two microbatches, by hand. Stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1.
  // s0: F0 [0,1] F1 [1,3]; s1: F0 [1,2] B0 [2,6]; s0: B0 [6,7]; s1: F1 [6,8] B1 [8,9]; s0: B1 [9,10].
  CHECK(one_f_one_b_makespan({{1, 2}, {1, 2}}, {{1, 1}, {4, 1}}) == doctest::Approx(10));
  CHECK_THROWS_AS(one_f_one_b_makespan({{1}, {1, 2}}, {{1}, {1, 2}}), std::invalid_argument);
  CHECK_THROWS_AS(one_f_one_b_makespan({{-1}}, {{1}}), std::invalid_argument);
  CHECK_THROWS_AS(one_f_one_b_makespan({}, {}), std::invalid_argument);
}
