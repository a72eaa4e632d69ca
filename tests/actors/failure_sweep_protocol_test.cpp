// Losses at every point of a step, swept (fixture: protocol_fixture.hpp): one or two nodes die
// while a step runs or while its commit is applied, with and without periodic checkpoints, on
// jobs where the survivors go on (six nodes) and where they are too few (four nodes: checkpoint and
// stop). Whatever the policy decides, the accounting must hold: every step is committed once, in
// order; a checkpoint holds the state after exactly the steps committed before it; the stop
// counts what was committed. The single cases in reconfiguration_*_test.cpp check what happens;
// this checks that nothing is counted twice or skipped anywhere (it found a commit that stood
// through a loss recorded twice when the policy then said checkpoint and stop).

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using oobleck::messages::stop_outcome;

namespace {

/// Where the victims die: while step `step` of epoch 1 runs (their stages hold its answer), while
/// its commit is applied (they hold the commit), or while the periodic checkpoint before it is
/// written (they hold their writes).
struct failure_point {
  enum kind_t { step_runs, commit_applied, checkpoint_written } kind = step_runs;
  std::uint64_t step = 1;
};

const char* state_of(failure_point::kind_t k) {
  switch (k) {
    case failure_point::step_runs: return "training";
    case failure_point::commit_applied: return "committing";
    case failure_point::checkpoint_written: return "checkpointing";
  }
  return "?";
}

std::string case_name(const std::vector<std::int64_t>& victims, const failure_point& p, std::uint64_t every) {
  std::string out = "victims";
  for (auto v : victims) out += " " + std::to_string(v);
  const char* where = p.kind == failure_point::step_runs        ? ", during step "
                      : p.kind == failure_point::commit_applied ? ", during the commit of step "
                                                                : ", writing the checkpoint before step ";
  return out + where + std::to_string(p.step) + ", checkpoint every " + std::to_string(every);
}

/// The failure points of steps 0 .. steps - 2 (and the checkpoints before them, when periodic).
std::vector<failure_point> points(std::uint64_t steps, std::uint64_t every) {
  std::vector<failure_point> out;
  for (std::uint64_t k = 0; k + 1 < steps; ++k) {
    out.push_back({failure_point::step_runs, k});
    out.push_back({failure_point::commit_applied, k});
    if (every > 0 && k > 0 && k % every == 0) out.push_back({failure_point::checkpoint_written, k});
  }
  return out;
}

/// Every non-empty set of at most `most` of the nodes 0 .. nodes - 1.
std::vector<std::vector<std::int64_t>> victim_sets(int nodes, int most) {
  std::vector<std::vector<std::int64_t>> out;
  for (unsigned mask = 1; mask < (1u << nodes); ++mask) {
    std::vector<std::int64_t> set;
    for (int n = 0; n < nodes; ++n)
      if (mask & (1u << n)) set.push_back(n);
    if (static_cast<int>(set.size()) <= most) out.push_back(set);
  }
  return out;
}

/// Runs the job of `nodes` nodes for `steps` steps with checkpoints (every `every` steps; 0: only
/// the policy's), kills `victims` at `point`, and checks the accounting.
void sweep_case(int nodes, std::uint64_t steps, std::uint64_t every, const std::vector<std::int64_t>& victims,
                failure_point point) {
  const std::string name = case_name(victims, point, every);
  CAPTURE(name);
  fixture f({.nodes = nodes, .steps = steps, .checkpoint_every = every, .checkpoints = true});
  fixture::setup_map setup;
  for (auto v : victims)
    setup[v] = [point](fake_stage_record& r) {
      if (point.kind == failure_point::commit_applied)
        r.hold_commit = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
      else if (point.kind == failure_point::step_runs)
        r.hold_step = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
      else
        r.hold_write = true;
    };
  f.start(setup);
  if (point.kind == failure_point::checkpoint_written) {
    // The checkpoint spreads its layers over some holders: victims it asks nothing of hold
    // nothing, and the job went on past it (another case).
    bool asked = false;
    for (auto v : victims) asked = asked || f.stages.at(v)->traced("write " + std::to_string(point.step));
    if (!asked) return;
  }
  REQUIRE(f.status().state == state_of(point.kind));
  for (auto v : victims) f.kill(v);
  f.sched.run();
  INFO(describe(f.events));

  // Every step committed once, in order, from 0 (records and events alike).
  const auto committed = all_of(f.events, {.kind = event_kind::step_committed});
  REQUIRE(committed.size() == f.records.size());
  for (std::size_t k = 0; k < f.records.size(); ++k) {
    CAPTURE(k);
    CHECK(f.records[k].step == k);
    CHECK(committed[k].step == k);
    CHECK(f.records[k].samples == f.job.global_batch);
  }
  // A commit decided before the loss stands, once; a step that had not reported is not committed
  // before the loss.
  CHECK(count(f.events, {.kind = event_kind::commit_stood}) <= 1u);
  if (point.kind == failure_point::commit_applied) CHECK(f.records.size() > point.step);
  // Each checkpoint holds the state after the steps committed before it: its step is their count.
  const auto written = all_of(f.events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == f.finished.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CAPTURE(i);
    const auto at = position(f.events, {.kind = event_kind::checkpoint_written, .step = written[i].step});
    std::uint64_t before = 0;
    for (std::size_t j = 0; j < at; ++j) before += f.events[j].kind == event_kind::step_committed ? 1 : 0;
    CHECK(written[i].step == before);
    CHECK(f.finished[i].first == before);
  }
  // The job ended once, counting what was committed: finished with every step, or stopped by
  // the policy (its checkpoint, when written, is of the step after the last committed).
  const auto& stop = f.stop();
  if (stop.outcome == stop_outcome::finished) {
    CHECK(f.records.size() == steps);
  } else {
    CHECK(stop.outcome == stop_outcome::checkpoint_and_stop);
    CHECK(stop.committed == f.records.size());
    REQUIRE(f.stops.size() == 1u);
    if (f.stops[0].dir) CHECK(f.stops[0].step == f.records.size());
  }
}

}  // namespace

TEST_CASE("failure sweep: nodes lost at every point of a step on six nodes: each step committed once") {
  // Two pipelines of three: one loss or two leave enough nodes unless a layer loses every holder;
  // three (a whole pipeline and more) make the policy stop.
  for (std::uint64_t every : {0u, 2u})
    for (const auto& victims : victim_sets(6, 3))
      for (const auto& p : points(5, every)) sweep_case(6, 5, every, victims, p);
}

TEST_CASE("failure sweep: nodes lost at every point of a step on four nodes, too few left: checkpoint and stop, each step once") {
  // Two pipelines of two: any loss leaves fewer than (f + 1) * n0 = 4.
  for (std::uint64_t every : {0u, 2u})
    for (const auto& victims : victim_sets(4, 3))
      for (const auto& p : points(5, every)) sweep_case(4, 5, every, victims, p);
}
