// The breakdown of a step's wall time (actors/step_breakdown.hpp): the slowest stage's and the
// slowest commit's own times, and the rest of each round trip as control messages.
#include "actors/step_breakdown.hpp"

#include <doctest/doctest.h>

using namespace oobleck;
using namespace std::chrono_literals;

TEST_CASE("step breakdown: the slowest stage and commit, control is the rest of each round trip, parts sum to the wall time") {
  actors::step_clock c;
  const auto t0 = actors::step_clock::clock::time_point{} + 1000ms;
  c.start(t0);
  // Two pipelines: the second reports last, but the first holds the stage busy longest.
  messages::pipeline_done a{1, 0, 0, 1.0, "", {.busy_ms = 40, .compute_ms = 30, .p2p_wait_ms = 6, .allreduce_ms = 2}};
  messages::pipeline_done b{1, 0, 1, 1.0, "", {.busy_ms = 35, .compute_ms = 33, .p2p_wait_ms = 1, .allreduce_ms = 1}};
  c.on_pipeline_done(a, t0 + 41ms);
  c.on_pipeline_done(b, t0 + 43ms);  // T1: run phase 43 ms, slowest busy 40: 3 ms of messaging
  c.on_step_committed({1, 0, 4, {}, 2.0, 1.5});
  c.on_step_committed({1, 0, 5, {}, 2.5, 1.75});  // the slowest commit
  c.on_step_committed({1, 0, 6, {}, 1.0, 0.5});
  const auto b2 = c.finish(t0 + 47ms);  // commit phase 4 ms, slowest 2.5: 1.5 ms of messaging
  CHECK(b2.compute_ms == 30);
  CHECK(b2.p2p_wait_ms == 6);
  CHECK(b2.allreduce_ms == 2);
  CHECK(b2.optimizer_ms == 1.75);
  CHECK(b2.control_ms == doctest::Approx(3 + 1.5));
  CHECK(b2.other_ms == doctest::Approx(2 + 0.75));
  CHECK(b2.compute_ms + b2.p2p_wait_ms + b2.allreduce_ms + b2.optimizer_ms + b2.control_ms + b2.other_ms ==
        doctest::Approx(47));
  // A new step starts from nothing.
  c.start(t0 + 100ms);
  CHECK(c.finish(t0 + 100ms).control_ms == 0);
}
