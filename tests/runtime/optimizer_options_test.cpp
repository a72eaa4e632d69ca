// The learning-rate schedule: a pure function of the update count, so a recovered layer carries on
// where its step count says (ARCHITECTURE.md §5).
#include "runtime/optimizer_options.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

using namespace oobleck::runtime;

TEST_CASE("cosine: linear warm-up, half a cosine down to min_lr, then the floor") {
  const lr_schedule s{.peak = 1.0, .warmup_steps = 10, .total_steps = 110, .min_lr = 0.1};
  CHECK(learning_rate(s, 0) == 0.0);  // before the first update
  CHECK(learning_rate(s, 1) == doctest::Approx(0.1));
  CHECK(learning_rate(s, 5) == doctest::Approx(0.5));
  CHECK(learning_rate(s, 10) == 1.0);   // the peak, exactly, at the end of the warm-up
  CHECK(learning_rate(s, 60) == doctest::Approx(0.55));  // half way through the cosine
  CHECK(learning_rate(s, 35) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(learning_rate(s, 110) == 0.1);
  CHECK(learning_rate(s, 500) == 0.1);
  for (std::uint64_t k = 10; k < 110; ++k) {
    CAPTURE(k);
    CHECK(learning_rate(s, k + 1) < learning_rate(s, k));
  }
}

TEST_CASE("linear decays in a straight line, and constant stays at the peak after the warm-up") {
  lr_schedule s{.peak = 2.0, .warmup_steps = 4, .total_steps = 104, .min_lr = 0.0, .decay = lr_decay::linear};
  CHECK(learning_rate(s, 2) == doctest::Approx(1.0));
  CHECK(learning_rate(s, 4) == 2.0);
  CHECK(learning_rate(s, 29) == doctest::Approx(1.5));
  CHECK(learning_rate(s, 54) == doctest::Approx(1.0));
  CHECK(learning_rate(s, 104) == 0.0);
  CHECK(learning_rate(s, 1000) == 0.0);
  s.decay = lr_decay::constant;
  CHECK(learning_rate(s, 2) == doctest::Approx(1.0));
  CHECK(learning_rate(s, 54) == 2.0);
  CHECK(learning_rate(s, 1000) == 2.0);
}

TEST_CASE("without a warm-up the first update already decays, and a warm-up past the end stays a ramp") {
  const lr_schedule none{.peak = 1.0, .warmup_steps = 0, .total_steps = 100, .min_lr = 0.0};
  CHECK(learning_rate(none, 1) < 1.0);
  CHECK(learning_rate(none, 1) > 0.99);
  const lr_schedule past{.peak = 1.0, .warmup_steps = 20, .total_steps = 10, .min_lr = 0.5};
  CHECK(learning_rate(past, 10) == doctest::Approx(0.5));
  CHECK(learning_rate(past, 20) == 1.0);
  CHECK(learning_rate(past, 21) == 0.5);
}

TEST_CASE("the schedule position is the update count: a run resumed at step k agrees with one that never stopped") {
  // What a copied layer relies on: no hidden state, only (schedule, step).
  const lr_schedule s{.peak = 3e-3, .warmup_steps = 7, .total_steps = 70, .min_lr = 3e-4};
  std::vector<double> uninterrupted;
  for (std::uint64_t k = 1; k <= 80; ++k) uninterrupted.push_back(learning_rate(s, k));
  const lr_schedule copy = s;
  for (std::uint64_t k = 40; k <= 80; ++k) CHECK(learning_rate(copy, k) == uninterrupted[k - 1]);
}

TEST_CASE("decay names round-trip, and anything else is refused") {
  for (auto d : {lr_decay::constant, lr_decay::linear, lr_decay::cosine}) CHECK(parse_lr_decay(lr_decay_name(d)) == d);
  CHECK(!parse_lr_decay("Cosine"));
  CHECK(!parse_lr_decay(""));
}
