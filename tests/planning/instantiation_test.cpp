#include "planning/instantiation.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <limits>
#include <random>

#include "planning/batch_distribution.hpp"
#include "planning/node_spec.hpp"

using namespace oobleck::planning;

namespace {

// min over all N_i >= 1 summing to m of max_i T_i(N_i), by enumeration.
double exhaustive_step(const std::vector<pipeline_time>& lines, int m) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> n(lines.size());
  std::function<void(std::size_t, int)> rec = [&](std::size_t i, int left) {
    if (i + 1 == lines.size()) {
      if (left < 1) return;
      n[i] = left;
      double worst = 0;
      for (std::size_t k = 0; k < lines.size(); ++k) worst = std::max(worst, lines[k].at(n[k]));
      best = std::min(best, worst);
      return;
    }
    for (int x = 1; x <= left - static_cast<int>(lines.size() - i - 1); ++x) {
      n[i] = x;
      rec(i + 1, left - x);
    }
  };
  rec(0, m);
  return best;
}

/// A linear T(Nb) half of the time, otherwise the 1F1B makespan of 1..4 random integer stages
/// (convex and curved for small Nb, not a line).
pipeline_time random_line(std::mt19937& rng) {
  if (rng() % 2 == 0) return pipeline_time::linear(static_cast<double>(rng() % 20), static_cast<double>(1 + rng() % 9));
  std::vector<double> f(1 + rng() % 4), b(f.size());
  for (std::size_t s = 0; s < f.size(); ++s) {
    f[s] = static_cast<double>(rng() % 5);
    b[s] = static_cast<double>(1 + rng() % 8);
  }
  return pipeline_time::one_f_one_b(f, b);
}

}  // namespace

TEST_CASE("batch distribution equals exhaustive search") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 4);
    const int m = p + static_cast<int>(rng() % 9);
    std::vector<pipeline_time> lines;
    for (int i = 0; i < p; ++i) lines.push_back(random_line(rng));
    const auto got = distribute_batch(lines, m);
    CAPTURE(trial);
    int sum = 0;
    for (int i = 0; i < p; ++i) {
      CHECK(got.microbatches[i] >= 1);
      CHECK(got.time_ms[i] == lines[i].at(got.microbatches[i]));
      sum += got.microbatches[i];
    }
    CHECK(sum == m);
    CHECK(got.step_ms == exhaustive_step(lines, m));
  }
}

TEST_CASE("batch distribution refuses more pipelines than microbatches and recommends a batch") {
  const std::vector<pipeline_time> lines(3, pipeline_time::linear(1, 1));
  try {
    distribute_batch(lines, 2, 4);
    FAIL("expected refusal");
  } catch (const planning_error& e) {
    CHECK(std::string(e.what()).find("nearest distributable global batch: 12") != std::string::npos);
  }
}

TEST_CASE("a global batch that is not a multiple of the microbatch is refused with both neighbours") {
  CHECK(microbatches_per_step(64, 4) == 16);
  try {
    microbatches_per_step(66, 4);
    FAIL("expected refusal");
  } catch (const planning_error& e) {
    CHECK(std::string(e.what()).find("64 or 68") != std::string::npos);
  }
  CHECK_THROWS_AS(microbatches_per_step(3, 4), planning_error);
}

TEST_CASE("instantiation equals exhaustive search over all template counts") {
  std::mt19937 rng(5);
  int solved = 0, unsolvable = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<template_option> options;
    const int first = 1 + static_cast<int>(rng() % 3);
    const int count = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < count; ++j) options.push_back({first + j, random_line(rng)});
    const int nodes = 1 + static_cast<int>(rng() % 14);
    const int min_p = 1 + static_cast<int>(rng() % 3);
    const int mbs = 1 + static_cast<int>(rng() % 12);
    // Exhaustive: every vector of counts x_j.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> x(count, 0);
    std::function<void(int, int)> rec = [&](int j, int left) {
      if (j == count) {
        if (left != 0) return;
        std::vector<pipeline_time> lines;
        for (int k = 0; k < count; ++k)
          for (int c = 0; c < x[k]; ++c) lines.push_back(options[k].time);
        const int p = static_cast<int>(lines.size());
        if (p < min_p || p > mbs) return;
        best = std::min(best, exhaustive_step(lines, mbs));
        return;
      }
      for (x[j] = 0; x[j] * options[j].nodes <= left; ++x[j]) rec(j + 1, left - x[j] * options[j].nodes);
      x[j] = 0;
    };
    rec(0, nodes);
    const auto got = instantiate(options, nodes, min_p, mbs);
    CAPTURE(trial);
    REQUIRE(got.has_value() == std::isfinite(best));
    if (!got) {
      ++unsolvable;
      continue;
    }
    ++solved;
    CHECK(got->batch.step_ms == best);
    int used = 0;
    for (int n : got->template_nodes) used += n;
    CHECK(used == nodes);
    CHECK(static_cast<int>(got->template_nodes.size()) >= min_p);
  }
  CHECK(solved > 100);
  CHECK(unsolvable > 10);
}

TEST_CASE("instantiation prefers more, shallower pipelines when they finish sooner") {
  // Template of 2 nodes: T(N) = 4 + 2N; of 4 nodes: T(N) = 8 + 1.5N (deeper pipeline, more bubble).
  const std::vector<template_option> options{{2, pipeline_time::linear(4, 2)}, {4, pipeline_time::linear(8, 1.5)}};
  const auto got = instantiate(options, 8, 2, 40);
  REQUIRE(got);
  // 4 x 2-node: 10 microbatches each -> 24. 2 x 4-node: 20 each -> 38. 2x2 + 1x4: ...
  CHECK(got->template_nodes == std::vector<int>{2, 2, 2, 2});
  CHECK(got->batch.step_ms == 24);
}

TEST_CASE("instantiation of 1024 nodes finishes and uses every node") {
  std::vector<template_option> options;
  for (int n = 3; n <= 40; ++n) options.push_back({n, pipeline_time::linear(10.0 * n, 100.0 / n + 1.0)});
  const auto got = instantiate(options, 1024, 3, 4096);
  REQUIRE(got);
  int used = 0;
  for (int n : got->template_nodes) used += n;
  CHECK(used == 1024);
}

TEST_CASE("node specification: n0, n_max and refusal") {
  // Model fits from 2 nodes on; 12 layers; N = 10, f = 2 -> n_max = min(12, 10 - 4) = 6.
  std::vector<bool> feasible(11, true);
  feasible[0] = feasible[1] = false;
  const auto spec = specify_nodes(feasible, 12, 10, 2);
  CHECK(spec.n0 == 2);
  CHECK(spec.n_max == 6);
  CHECK(spec.covered_node_counts == std::vector<int>{6, 7, 8, 9, 10});
  try {
    specify_nodes(feasible, 12, 5, 2);
    FAIL("expected refusal");
  } catch (const planning_error& e) {
    CHECK(std::string(e.what()).find("6 nodes, but the job has 5") != std::string::npos);
  }
  CHECK_THROWS_AS(specify_nodes(std::vector<bool>(5, false), 12, 4, 0), planning_error);
  CHECK_THROWS_AS(specify_nodes(feasible, 12, 10, -1), planning_error);
}

TEST_CASE("covered node counts: every count once n_max >= 2 n0 - 1, gaps otherwise") {
  for (int n0 = 1; n0 <= 5; ++n0)
    for (int f = 0; f <= 3; ++f) {
      std::vector<int> sizes;
      for (int n = n0; n <= 2 * n0 - 1; ++n) sizes.push_back(n);
      const int lo = (f + 1) * n0;
      const auto covered = covered_node_counts(sizes, f + 1, lo, lo + 30);
      CHECK(covered.size() == 31);
    }
  // Only 3-node templates, f = 1: 6, 9, 12 are covered, nothing between.
  CHECK(covered_node_counts({3}, 2, 6, 13) == std::vector<int>{6, 9, 12});
  // {3, 4}: 6 7 8 (3+3, 3+4, 4+4), 9 (3+3+3), 10, 11, 12 ...; 5 is below the range.
  CHECK(covered_node_counts({3, 4}, 2, 6, 12) == std::vector<int>{6, 7, 8, 9, 10, 11, 12});
}
