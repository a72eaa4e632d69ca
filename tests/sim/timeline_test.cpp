#include "sim/timeline.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace oobleck::sim;

namespace {
double part(const timeline& t, activity a) { return t.breakdown()[static_cast<int>(a)]; }
}  // namespace

TEST_CASE("whole steps count, a failure loses the step in progress, a pause then resumes training") {
  timeline t(0);
  t.run({.step_ms = 100, .samples_per_step = 8, .nodes = 2});
  t.advance_to(1050);
  CHECK(t.samples() == 80);
  t.interrupt();
  t.pause(activity::reconfiguration, 200);
  t.run({.step_ms = 50, .samples_per_step = 8});
  t.advance_to(1500);  // resumes at 1250: 5 steps
  t.close();
  CHECK(t.samples() == 120);
  CHECK(part(t, activity::effective) == 1250);
  CHECK(part(t, activity::fallback) == 50);
  CHECK(part(t, activity::reconfiguration) == 200);
}

TEST_CASE("a join lets the step in progress finish before its pause") {
  timeline t(0);
  t.run({.step_ms = 100, .samples_per_step = 1});
  t.advance_to(150);
  t.finish_step();
  t.pause(activity::reconfiguration, 30);
  t.run({.step_ms = 10, .samples_per_step = 1});
  t.advance_to(300);  // step ends 200, pause to 230, 7 steps
  t.close();
  CHECK(t.samples() == 9);
  CHECK(part(t, activity::fallback) == 0);
  CHECK(part(t, activity::reconfiguration) == 30);
}

TEST_CASE("checkpoints every k steps are durable points, a fallback loses what came after the last") {
  timeline t(0);
  t.run({.step_ms = 100, .samples_per_step = 1});
  t.checkpoint_every(3, 40);
  t.advance_to(590);  // 3 steps, checkpoint 300-340, steps 340-440, 440-540, partial
  CHECK(t.samples() == 5);
  t.interrupt();
  t.fall_back_to_checkpoint();
  CHECK(t.samples() == 3);
  t.close();
  CHECK(part(t, activity::checkpoint) == 40);
  CHECK(part(t, activity::fallback) == 250);  // two lost steps and the partial one
  CHECK(part(t, activity::effective) == 300);
}

TEST_CASE("a pause cut by a failure keeps the time it took, a step open at the end counts pro rata") {
  timeline t(0);
  t.pause(activity::restart, 1000);
  t.run({.step_ms = 100, .samples_per_step = 10, .redundant_ms = 20});
  t.advance_to(400);
  t.interrupt();
  t.stop();
  t.advance_to(600);
  t.pause(activity::restart, 100);
  t.run({.step_ms = 100, .samples_per_step = 10, .redundant_ms = 20});
  t.advance_to(750);
  t.close();
  CHECK(part(t, activity::restart) == 500);
  CHECK(part(t, activity::stopped) == 200);
  CHECK(t.samples() == doctest::Approx(5));
  CHECK(part(t, activity::redundant) == doctest::Approx(10));
  CHECK(part(t, activity::effective) == doctest::Approx(40));
}

TEST_CASE("misuse is a logic error, not a silent mistake") {
  timeline t(0);
  t.run({.step_ms = 100, .samples_per_step = 1});
  CHECK_THROWS_AS(t.pause(activity::reconfiguration, 1), std::logic_error);
  t.advance_to(10);
  CHECK_THROWS_AS(t.advance_to(5), std::logic_error);
  t.interrupt();
  CHECK_THROWS_AS(t.run({.step_ms = 0}), std::logic_error);
}
