// The coordinator's own losses at every point of a step, swept (fixture: protocol_fixture.hpp;
// shared parts: failure_sweep.hpp; the nodes' losses: failure_sweep_protocol_test.cpp): cut off
// from every node (frozen, or its links down), with a node dying meanwhile, then adopting them
// back; killed and replaced by a coordinator that adopts the job from the workers' memory, with a
// node dying too, in jobs that wait for nodes and in jobs that do not; without run-ahead and on
// nodes of two slots. The accounting must hold as in the nodes' sweep, except that a replaced
// coordinator's last decided step has no record (it died with that process). What it found is in
// the nodes' sweep's header.

#include <doctest/doctest.h>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "actors/failure_sweep.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using oobleck::messages::stop_outcome;

namespace {

/// The coordinator frozen or cut off at `point` (node `held`'s stage holds its answer there, so
/// the job is in that phase): every node loses it at once and it loses every node. It waits for
/// them (adopting); they come back with their state; the job goes on from their memory. Simulated
/// time passes a second at a time until the job ends.
void freeze_case(fixture::options o, std::int64_t held, failure_point point, std::optional<std::int64_t> gone = {}) {
  o.checkpoints = true;
  const std::string name = case_name({held}, point, o) + ", the coordinator cut off" +
                           (gone ? ", node " + std::to_string(*gone) + " dies meanwhile" : "");
  CAPTURE(name);
  fixture f(o);
  if (!start_held(f, held, point)) return;
  if (gone) {
    f.kill(*gone);
    // The held node is slow, not stuck (stuck too, with another holder of its layers gone, the
    // job's state would be gone and the adoption rightly fails without a checkpoint).
    release(*f.stages.at(held));
  }
  for (std::int64_t n = 0; n < o.nodes; ++n) {
    if (gone && n == *gone) continue;
    const auto monitor = caf::actor_cast<caf::actor>(f.monitors.at(n));
    caf::anon_send(monitor, caf::down_msg{f.coord.address(), caf::exit_reason::remote_link_unreachable});
    caf::send_as(monitor, caf::actor_cast<caf::actor>(f.coord),
                 caf::down_msg{f.monitors.at(n).address(), caf::exit_reason::remote_link_unreachable});
  }
  run_until_stopped(f);
  INFO(describe(f.events));
  CHECK(f.told("every node was lost at once"));
  // Without a node that died meanwhile, the job is adopted back whole and finishes; with one, it
  // goes on without it, or stops as the policy says when too few are left.
  if (!gone) CHECK(f.stop().outcome == stop_outcome::finished);
  else CHECK((f.stop().outcome == stop_outcome::finished || f.stop().outcome == stop_outcome::checkpoint_and_stop));
  check_resumed_accounting(f, o.steps);
}

/// The coordinator's process killed at `point` (node `held`'s stage holds its answer there) and a
/// replacement started: the workers come back to it with their state and it adopts the job. A
/// step whose commit the first decided but did not live to record has no record (it died with
/// that process), at most one, right before the step the replacement ran first; otherwise every
/// step once, in order.
void replacement_case(fixture::options o, std::int64_t held, failure_point point, std::optional<std::int64_t> gone = {}) {
  o.checkpoints = true;
  const std::string name = case_name({held}, point, o) + ", the coordinator replaced" +
                           (gone ? ", node " + std::to_string(*gone) + " dies with it" : "") +
                           (o.wait_below_minimum ? ", the job waits for nodes" : "");
  CAPTURE(name);
  fixture f(o);
  if (!start_held(f, held, point)) return;
  if (gone) f.kill(*gone);
  // The held node is slow, not stuck: once its coordinator is gone it answers what it is asked.
  release(*f.stages.at(held));
  const std::size_t replaced_at = f.events.size();
  f.replace_coordinator();
  int next_worker = o.nodes;
  run_until_stopped(f, [&] {
    // A node short in a job that waits for nodes: it waits (for the job's nodes as at its start
    // when nothing was committed, below its minimum otherwise); one joins.
    if (gone && next_worker == o.nodes && !f.happened({.kind = event_kind::stopped})) {
      const auto state = f.status().state;
      if (state == "registering" || state == "waiting") {
        REQUIRE(o.wait_below_minimum);
        f.add_worker(next_worker++);
        f.sched.run();
      }
    }
  });
  INFO(describe(f.events));
  // Adopted from the nodes' memory (a restore record, once its first step committed), or planned
  // afresh when none had committed.
  REQUIRE(f.restores.size() <= 1u);
  const std::uint64_t first_run = f.restores.empty() ? 0 : f.restores[0].step;
  std::uint64_t next = 0;
  bool first_after = true;  // the replacement's first step or checkpoint
  for (std::size_t i = 0; i < f.events.size(); ++i) {
    const auto& e = f.events[i];
    CAPTURE(describe(e));
    if (e.kind != event_kind::step_committed && e.kind != event_kind::checkpoint_written) continue;
    if (i >= replaced_at && first_after) {
      first_after = false;
      // The step the first coordinator decided but did not live to record: it counts, without a record.
      if (e.step == next + 1 && (f.restores.empty() || first_run == e.step))
        ++next;
    }
    CHECK(e.step == next);
    if (e.kind == event_kind::step_committed) next = e.step + 1;
  }
  CHECK(count(f.events, {.kind = event_kind::commit_stood}) <= 1u);
  const auto& stop = f.stop();
  CHECK(stop.committed == next);  // the replacement counts the step whose record died with the first
  if (!gone || o.wait_below_minimum || stop.outcome == stop_outcome::finished) {
    CHECK(stop.outcome == stop_outcome::finished);
    CHECK(next == o.steps);
  } else {
    CHECK(stop.outcome == stop_outcome::checkpoint_and_stop);  // too few nodes came back
  }
}

}  // namespace

TEST_CASE("coordinator loss sweep: the coordinator cut off from every node at every point of a step: it adopts them back, each step once") {
  for (int nodes : {6, 4})
    for (std::int64_t held : {0, 1})
      for (const auto& p : points(5, 2)) {
        freeze_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, held, p);
        for (std::int64_t gone = 0; gone < nodes; ++gone)
          if (gone != held) freeze_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, held, p, gone);
      }
}

TEST_CASE("coordinator loss sweep: the coordinator killed at every point of a step and replaced: it adopts the job, each step once") {
  for (int nodes : {6, 4})
    for (std::int64_t held : {0, 1})
      for (const auto& p : points(5, 2)) {
        replacement_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, held, p);
        for (std::int64_t gone = 0; gone < nodes; ++gone)
          if (gone != held)
            for (const bool waits : {false, true})
              replacement_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2, .wait_below_minimum = waits}, held,
                               p, gone);
      }
}

TEST_CASE("coordinator loss sweep: cut off and replaced, without run-ahead and on nodes of two slots") {
  for (const auto& o : variant_jobs())
    for (const auto& p : points(o.steps, o.checkpoint_every))
      for (std::int64_t held : {0, 1}) {
        freeze_case(o, held, p);
        replacement_case(o, held, p);
      }
}
