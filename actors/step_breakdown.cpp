#include "actors/step_breakdown.hpp"

namespace oobleck::actors {

namespace {
double ms(step_clock::clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace

void step_clock::start(clock::time_point t0) {
  *this = {};
  started = reported = t0;
}

void step_clock::on_pipeline_done(const messages::pipeline_done& d, clock::time_point now) {
  reported = now;
  if (d.slowest.busy_ms.value >= slowest_stage.busy_ms.value) slowest_stage = d.slowest;
}

void step_clock::on_step_committed(const messages::step_committed& c) {
  if (c.commit_ms.value < slowest_commit_ms) return;
  slowest_commit_ms = c.commit_ms;
  slowest_commit_optimizer_ms = c.optimizer_ms;
}

step_breakdown step_clock::finish(clock::time_point t2) const {
  const auto& s = slowest_stage;
  step_breakdown b;
  b.compute_ms = s.compute_ms;
  b.p2p_wait_ms = s.p2p_wait_ms;
  b.allreduce_ms = s.allreduce_ms;
  b.optimizer_ms = slowest_commit_optimizer_ms;
  b.control_ms = (ms(reported - started) - s.busy_ms) + (ms(t2 - reported) - slowest_commit_ms);
  b.other_ms = (s.busy_ms - s.compute_ms - s.p2p_wait_ms - s.allreduce_ms) +
               (slowest_commit_ms - slowest_commit_optimizer_ms);
  b.ahead_ms = ahead_ms;
  return b;
}

}  // namespace oobleck::actors
