// The sampler decides which samples form a step: it must not depend on the configuration.
#include "runtime/sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

using oobleck::runtime::sampler;

TEST_CASE("step samples are a pure function of (seed, step, global batch)") {
  const sampler a(7, 1000, 32), b(7, 1000, 32), other_seed(8, 1000, 32);
  for (int step : {0, 1, 17, 500}) {
    CHECK(a.step_samples(step) == b.step_samples(step));
    CHECK(a.step_samples(step) != other_seed.step_samples(step));
  }
  CHECK(a.step_samples(3) != a.step_samples(4));
}

TEST_CASE("every epoch visits every sample exactly once") {
  for (std::int64_t n : {1, 2, 7, 100, 1023, 1024, 1025}) {
    const sampler s(3, n, 1);
    for (std::int64_t epoch : {0, 1, 5}) {
      std::vector<std::int64_t> seen;
      for (std::int64_t i = 0; i < n; ++i) seen.push_back(s.permuted(epoch, i));
      std::sort(seen.begin(), seen.end());
      for (std::int64_t i = 0; i < n; ++i) CHECK(seen[i] == i);
    }
  }
  // Steps walk through epochs: 10 steps of 30 over 100 samples cover epochs 0..2 in order.
  const sampler s(3, 100, 30);
  std::multiset<std::int64_t> first_epoch;
  for (int step = 0; step < 3; ++step)
    for (auto id : s.step_samples(step)) first_epoch.insert(id);
  for (auto id : s.step_samples(3)) {
    if (first_epoch.size() == 100) break;
    first_epoch.insert(id);
  }
  CHECK(std::set<std::int64_t>(first_epoch.begin(), first_epoch.end()).size() == 100);
}

TEST_CASE("pipelines take contiguous slices that partition the step, whatever the split") {
  const sampler s(11, 5000, 64);
  const auto ids = s.step_samples(9);
  for (const std::vector<int>& split : {std::vector<int>{16}, {3, 5, 8}, {8, 8}, {1, 1, 14}}) {
    std::vector<std::int64_t> joined;
    for (int p = 0; p < static_cast<int>(split.size()); ++p) {
      const auto part = sampler::slice(ids, split, p, 4);
      CHECK(part.size() == static_cast<std::size_t>(split[p] * 4));
      joined.insert(joined.end(), part.begin(), part.end());
    }
    CHECK(joined == ids);
  }
}

TEST_CASE("bad sampler arguments are refused") {
  CHECK_THROWS_AS(sampler(1, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(sampler(1, 10, 0), std::invalid_argument);
}
