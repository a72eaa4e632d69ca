// Losses at every point of a step, swept (fixture: protocol_fixture.hpp): one, two or three nodes
// die while the first epoch forms, while a step runs, while its commit is applied or while a
// periodic checkpoint is written, on jobs where the survivors go on (six nodes) and where they are
// too few (four nodes: checkpoint and stop); then the same with a second round of losses while the
// recovery needs those nodes (forming the next epoch, writing the stop's checkpoint), without run-
// ahead, on nodes of two slots, with evaluation rounds, with a node whose stage fails a step every
// time, with nodes joining as others die, with nodes that hang instead of dying (the deadlines end
// it), in jobs that wait for nodes below their minimum and resume from memory or from a checkpoint,
// with the coordinator cut off from every node (it adopts them back), with the coordinator killed
// and replaced (with a node dying too), with a node's own stage failing (a strike, or an eviction
// when applying a commit), and with late copies of old messages. Whatever happens, the accounting
// must hold: every step committed once, in order (after a resume from an older checkpoint, again
// from its step; a replaced coordinator's last decided step without a record); a checkpoint holds
// the state the next step starts from; the job ends once and its stop counts what was committed.
// The single cases in reconfiguration_*_test.cpp check what happens; this checks that nothing is
// counted twice, skipped or left hanging anywhere. It found seven bugs: a commit that stood through
// a loss was recorded twice when the policy then said checkpoint and stop; that stop waited for a
// periodic checkpoint abandoned for the same loss (a hang here); a commit the coordinator was
// confirming when it lost every node had no record once it adopted them back; an adopted job too
// small to go on went to its fallback checkpoint along an edge the phase machine did not have;
// nodes lost before anything trained (while the first epoch formed, the coordinator cut off then,
// or a replacement's nodes that had committed nothing) failed the job when too few were left to
// plan it; and a stage failure of epoch 0, or of an epoch not assigned yet, counted as a strike.

#include <doctest/doctest.h>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using oobleck::messages::stop_outcome;
namespace messages = oobleck::messages;
namespace planning = oobleck::planning;

namespace {

/// Where the victims die: while step `step` of epoch 1 runs (their stages hold its answer), while
/// its commit is applied (they hold the commit), or while the periodic checkpoint before it is
/// written (they hold their writes).
struct failure_point {
  enum kind_t { step_runs, commit_applied, checkpoint_written, first_forming } kind = step_runs;
  std::uint64_t step = 1;
};

const char* state_of(failure_point::kind_t k) {
  switch (k) {
    case failure_point::step_runs: return "training";
    case failure_point::commit_applied: return "committing";
    case failure_point::checkpoint_written: return "checkpointing";
    case failure_point::first_forming: return "forming";
  }
  return "?";
}

/// A stage that holds its answer at `point` (and never gives it).
void hold_at(fake_stage_record& r, const failure_point& point) {
  if (point.kind == failure_point::commit_applied)
    r.hold_commit = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
  else if (point.kind == failure_point::step_runs)
    r.hold_step = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
  else if (point.kind == failure_point::first_forming)
    r.hold_form = {1};
  else
    r.hold_write = true;
}

std::string case_name(const std::vector<std::int64_t>& victims, const failure_point& p, const fixture::options& o) {
  std::string out = "victims";
  for (auto v : victims) out += " " + std::to_string(v);
  const std::string job = std::to_string(o.nodes) + " nodes, checkpoint every " + std::to_string(o.checkpoint_every) +
                          (o.run_ahead ? "" : ", without run-ahead") +
                          (o.slots > 1 ? ", " + std::to_string(o.slots) + " slots" : "") +
                          (o.digest_every > 1 ? ", digests every " + std::to_string(o.digest_every) : "");
  if (p.kind == failure_point::first_forming) return out + ", forming the first epoch; " + job;
  const char* where = p.kind == failure_point::step_runs        ? ", during step "
                      : p.kind == failure_point::commit_applied ? ", during the commit of step "
                                                                : ", writing the checkpoint before step ";
  return out + where + std::to_string(p.step) + "; " + job;
}

/// The failure points: the first epoch forming, then steps 0 .. steps - 2 (and the checkpoints
/// before them, when periodic).
std::vector<failure_point> points(std::uint64_t steps, std::uint64_t every) {
  std::vector<failure_point> out{{failure_point::first_forming, 0}};
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

/// What must hold however the failures went: every step committed once, in order, from 0
/// (records and events alike); at most `stood_at_most` commits stood through a loss; each
/// checkpoint holds the state after the steps committed before it; the job ended once, finished
/// with every step or stopped by the policy (or, `may_fail`, by failures in a row) counting what
/// was committed; evaluation rounds once each.
void check_accounting(const fixture& f, std::uint64_t steps, std::size_t stood_at_most, bool may_fail = false) {
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
  // A commit decided before a loss stands, once.
  CHECK(count(f.events, {.kind = event_kind::commit_stood}) <= stood_at_most);
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
  CHECK(stop.committed == f.records.size());
  if (stop.outcome == stop_outcome::finished) {
    CHECK(f.records.size() == steps);
  } else {
    // The policy's stop, or (with injected stage errors) failures in a row without a loss.
    CHECK((stop.outcome == stop_outcome::checkpoint_and_stop || (may_fail && stop.outcome == stop_outcome::failed)));
    if (stop.outcome == stop_outcome::checkpoint_and_stop) {
      REQUIRE(f.stops.size() == 1u);
      if (f.stops[0].dir) CHECK(f.stops[0].step == f.records.size());
    }
  }
  // Evaluation rounds, when the job has them: each recorded once, after a committed step.
  for (std::size_t i = 0; i < f.evals.size(); ++i) {
    CAPTURE(i);
    CHECK(f.evals[i].step < f.records.size());
    if (i > 0) CHECK(f.evals[i].step > f.evals[i - 1].step);
  }
}

/// Runs the job `o` (with checkpoints: every o.checkpoint_every steps, or only the policy's),
/// kills `victims` at `point`, and checks the accounting.
void sweep_case(fixture::options o, const std::vector<std::int64_t>& victims, failure_point point,
                const fixture::setup_map& also = {}, int joins = 0) {
  o.checkpoints = true;
  const std::uint64_t steps = o.steps;
  const std::string name = case_name(victims, point, o) + (joins > 0 ? ", " + std::to_string(joins) + " joining" : "");
  CAPTURE(name);
  fixture f(o);
  fixture::setup_map setup = also;
  for (auto v : victims)
    setup[v] = [point, before = also.count(v) ? also.at(v) : nullptr](fake_stage_record& r) {
      if (before) before(r);
      hold_at(r, point);
    };
  f.start(setup);
  if (point.kind == failure_point::checkpoint_written) {
    // The checkpoint spreads its layers over some holders: victims it asks nothing of hold
    // nothing, and the job went on past it (another case).
    bool asked = false;
    for (auto v : victims) asked = asked || f.stages.at(v)->traced("write " + std::to_string(point.step));
    if (!asked) return;
  }
  if (!also.empty() && f.happened({.kind = event_kind::stopped})) return;  // the injected errors ended it first
  REQUIRE(f.status().state == state_of(point.kind));
  for (auto v : victims) f.kill(v);
  for (int j = 0; j < joins; ++j) f.add_worker(o.nodes + j);
  f.sched.run();
  if (!f.happened({.kind = event_kind::stopped}) && f.status().state == "registering") {
    // Lost before anything trained and too few left to plan: the job waits for its nodes as at
    // its start; as many join as died.
    REQUIRE(point.kind == failure_point::first_forming);
    for (std::size_t j = 0; j < victims.size(); ++j) f.add_worker(o.nodes + joins + static_cast<int>(j));
    f.sched.run();
  }
  INFO(describe(f.events));
  // A commit decided before the loss stands: the step is committed (once, below).
  if (point.kind == failure_point::commit_applied) CHECK(f.records.size() > point.step);
  check_accounting(f, steps, 1, !also.empty());
}

/// Two rounds of losses: `first` die at `point`; then `second`, whose stages hold the forming of
/// epoch 2 and every checkpoint write, die while the recovery needs them (forming the next epoch,
/// or writing the policy's checkpoint before the stop). A second round that would ask nothing of
/// `second` is another case: skipped.
void two_round_case(int nodes, std::uint64_t steps, const std::vector<std::int64_t>& first, failure_point point,
                    const std::vector<std::int64_t>& second) {
  std::string name = case_name(first, point, fixture::options{.nodes = nodes, .steps = steps}) + "; then";
  for (auto v : second) name += " " + std::to_string(v);
  CAPTURE(name);
  fixture f({.nodes = nodes, .steps = steps, .checkpoints = true});
  fixture::setup_map setup;
  for (auto v : first)
    setup[v] = [point](fake_stage_record& r) { hold_at(r, point); };
  for (auto v : second)
    setup[v] = [](fake_stage_record& r) {
      r.hold_form = {2};
      r.hold_write = true;
    };
  f.start(setup);
  REQUIRE(f.status().state == state_of(point.kind));
  for (auto v : first) f.kill(v);
  f.sched.run();
  bool needed = false;
  for (auto v : second)
    needed = needed || f.stages.at(v)->traced("assign 2") || !f.stages.at(v)->writes.empty();
  if (!needed) return;
  const auto state = f.status().state;
  REQUIRE((state == "forming" || state == "checkpointing"));
  for (auto v : second) f.kill(v);
  f.sched.run();
  if (!f.happened({.kind = event_kind::stopped}) && f.status().state == "registering") {
    // Before anything trained, too few left to plan: it waits for the job's nodes; they join.
    REQUIRE(point.kind == failure_point::first_forming);
    for (std::size_t j = 0; j < first.size() + second.size(); ++j) f.add_worker(nodes + static_cast<int>(j));
    f.sched.run();
  }
  check_accounting(f, steps, 1);
  // The second round's nodes computed nothing after they died: no step of epoch 2 or later.
  for (auto v : second) CHECK(f.stages.at(v)->runs_of(point.step, 2) == 0u);
}

/// A held stage answers again from now on (what it held stays unanswered).
void release(fake_stage_record& r) {
  r.hold_step.reset();
  r.hold_commit.reset();
  r.hold_write = false;
  r.hold_form.clear();
}

/// Starts the job's workers, each looking for a coordinator when it loses its own, with node
/// `held`'s stage holding its answer at `point`, and runs it there; false when the point does not
/// arise (a checkpoint that asks nothing of `held`).
bool start_held(fixture& f, std::int64_t held, failure_point point) {
  const auto hold = [held, point](fake_stage_record& r) {
    if (r.node == held) hold_at(r, point);
  };
  for (int i = 0; i < f.opts.nodes; ++i)
    f.add_worker({.name = "w" + std::to_string(i), .setup = hold, .slots = f.opts.slots, .finds_coordinator = true});
  f.sched.run();
  if (point.kind == failure_point::checkpoint_written && !f.stages.at(held)->traced("write " + std::to_string(point.step)))
    return false;
  REQUIRE(f.status().state == state_of(point.kind));
  return true;
}

/// Simulated time passes a second at a time (deadlines fire, nodes look for a coordinator again)
/// until the job stops, for at most 15 minutes of it; `each` runs after every second.
void run_until_stopped(fixture& f, const std::function<void()>& each = {}) {
  for (int seconds = 0; seconds < 900 && !f.happened({.kind = event_kind::stopped}); ++seconds) {
    f.sched.advance_time(std::chrono::seconds(1));
    f.sched.run();
    if (each) each();
  }
  INFO(describe(f.events));
  REQUIRE(f.happened({.kind = event_kind::stopped}));
}

/// Victims that hang instead of dying: their stages hold their answer at `point` and never give
/// it (a step, a commit, a checkpoint write), and the coordinator's deadlines must end it (the
/// step runs again, a late commit's node is evicted, a writer is replaced). Simulated time passes
/// a second at a time until the job ends.
void hang_case(fixture::options o, const std::vector<std::int64_t>& victims, failure_point point) {
  o.checkpoints = true;
  const std::string name = case_name(victims, point, o) + ", hanging";
  CAPTURE(name);
  fixture f(o);
  fixture::setup_map setup;
  for (auto v : victims)
    setup[v] = [point](fake_stage_record& r) { hold_at(r, point); };
  f.start(setup);
  run_until_stopped(f);
  INFO(describe(f.events));
  check_accounting(f, o.steps, 1, true);
}

/// The accounting of a job that may resume from a checkpoint older than its last commit (the
/// steps after it run again): each committed step is the one after the previous commit, or the
/// step of the checkpoint the job just resumed from; each checkpoint holds the state the next step
/// starts from; a finished job committed its last step.
void check_resumed_accounting(const fixture& f, std::uint64_t steps) {
  INFO(describe(f.events));
  std::uint64_t next = 0;
  std::size_t resumes = 0;
  for (const auto& e : f.events) {
    CAPTURE(describe(e));
    if (e.kind == event_kind::step_committed) {
      CHECK(e.step == next);
      next = e.step + 1;
    } else if (e.kind == event_kind::resumed) {
      REQUIRE(resumes < f.resumes.size());
      const auto& r = f.resumes[resumes++];
      if (r.source == "checkpoint") {
        CHECK(r.step <= next);
        next = r.step;
      } else {
        CHECK(r.step == next);  // from memory: the committed state
      }
    } else if (e.kind == event_kind::checkpoint_written) {
      CHECK(e.step == next);
    }
  }
  CHECK(resumes == f.resumes.size());
  const auto& stop = f.stop();
  if (stop.outcome == stop_outcome::finished) CHECK(next == steps);
  for (std::size_t k = 0; k < f.records.size(); ++k) CHECK(f.records[k].samples == f.job.global_batch);
}

/// A job that waits for nodes below its minimum: `victims` die at `point`; while it waits, as many
/// nodes join as died (up to three rounds), and it resumes from memory or from a checkpoint.
void wait_case(fixture::options o, const std::vector<std::int64_t>& victims, failure_point point,
               bool survivor_dies = false) {
  o.checkpoints = true;
  o.wait_below_minimum = true;
  const std::string name =
      case_name(victims, point, o) + ", waiting for nodes" + (survivor_dies ? ", a survivor dies while it waits" : "");
  CAPTURE(name);
  fixture f(o);
  fixture::setup_map setup;
  for (auto v : victims) setup[v] = [point](fake_stage_record& r) { hold_at(r, point); };
  f.start(setup);
  if (point.kind == failure_point::checkpoint_written) {
    bool asked = false;
    for (auto v : victims) asked = asked || f.stages.at(v)->traced("write " + std::to_string(point.step));
    if (!asked) return;
  }
  REQUIRE(f.status().state == state_of(point.kind));
  for (auto v : victims) f.kill(v);
  f.sched.run();
  int next_worker = o.nodes;
  std::size_t dead = victims.size();
  if (survivor_dies && !f.happened({.kind = event_kind::stopped}) && f.status().state == "waiting") {
    // The first survivor dies too while the job waits: its layers may be in no one's memory now.
    for (std::int64_t n = 0; n < o.nodes; ++n)
      if (std::find(victims.begin(), victims.end(), n) == victims.end()) {
        f.kill(n);
        ++dead;
        break;
      }
    f.sched.run();
  }
  const auto waits = [&] {
    if (f.happened({.kind = event_kind::stopped})) return false;
    const auto state = f.status().state;
    return state == "waiting" || state == "registering";  // registering: lost before anything trained
  };
  for (int round = 0; round < 3 && waits(); ++round) {
    for (std::size_t j = 0; j < dead; ++j) f.add_worker(next_worker++);
    f.sched.run();
  }
  REQUIRE(f.happened({.kind = event_kind::stopped}));
  check_resumed_accounting(f, o.steps);
}

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
      if (e.step == next + (e.kind == event_kind::step_committed ? 1 : 1) && (f.restores.empty() || first_run == e.step))
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

/// A node's own stage fails (node_fault, as its monitor reports an exception: out of memory) while
/// node `held`'s stage holds its answer at `point`: a strike and the step again, or, applying a
/// commit (`in_commit`), an eviction. Simulated time passes until the job ends.
void fault_case(fixture::options o, std::int64_t held, failure_point point, std::int64_t faulty, bool in_commit) {
  o.checkpoints = true;
  const std::string name = case_name({held}, point, o) + "; node " + std::to_string(faulty) +
                           (in_commit ? " fails applying a commit" : " fails its step");
  CAPTURE(name);
  fixture f(o);
  f.start({{held, [point](fake_stage_record& r) { hold_at(r, point); }}});
  if (point.kind == failure_point::checkpoint_written && !f.stages.at(held)->traced("write " + std::to_string(point.step)))
    return;
  REQUIRE(f.status().state == state_of(point.kind));
  caf::send_as(f.monitors.at(faulty), f.coord,
               messages::node_fault{1, planning::node_id{faulty}, "injected: out of memory", true, in_commit});
  run_until_stopped(f);
  INFO(describe(f.events));
  check_accounting(f, o.steps, 1, true);
}

/// Late copies of what nodes already said, delivered at `point` (node `held` holds its answer
/// there) from every node's own monitor: an acknowledgement of the previous step's commit, a
/// ready of the formed epoch, a stage failure of epoch 0 (none runs in it) and of an epoch not
/// assigned yet, an abort of epoch 0, a stall report of a probe never sent, a checkpoint writer's
/// error for a request never made. Each is dropped (counted), and
/// the job then goes on as it would have: `held` dies, the accounting holds, and no failure or
/// strike came of the echoes.
void echo_case(fixture::options o, std::int64_t held, failure_point point) {
  o.checkpoints = true;
  const std::string name = case_name({held}, point, o) + ", late copies of old messages";
  CAPTURE(name);
  fixture f(o);
  if (!start_held(f, held, point)) return;
  const std::uint64_t step = point.kind == failure_point::first_forming ? 0 : point.step;
  for (std::int64_t n = 0; n < o.nodes; ++n) {
    const auto monitor = caf::actor_cast<caf::actor>(f.monitors.at(n));
    const auto coord = caf::actor_cast<caf::actor>(f.coord);
    if (step > 0) caf::send_as(monitor, coord, messages::step_committed{1, step - 1, planning::node_id{n}, {}});
    if (point.kind != failure_point::first_forming)
      caf::send_as(monitor, coord, messages::node_ready{1, planning::node_id{n}, {}, {}});
    caf::send_as(monitor, coord, messages::node_fault{0, planning::node_id{n}, "a late echo", true, false});
    caf::send_as(monitor, coord, messages::node_fault{7, planning::node_id{n}, "a late echo", true, false});  // no such epoch yet
    caf::send_as(monitor, coord, messages::epoch_aborted{0, planning::node_id{n}});
    // A stall report of a probe never sent, naming its node as computing for ever.
    caf::send_as(monitor, coord, messages::stall_report{99, planning::node_id{n}, 1, true, false, 1e9, 0});
    // A checkpoint writer's answer to a request never made, with an error.
    caf::send_as(monitor, coord, messages::checkpoint_written{99, planning::node_id{n}, {}, {}, "a late echo"});
  }
  f.sched.run();
  CHECK(f.status().state == state_of(point.kind));  // nothing moved
  f.kill(held);
  run_until_stopped(f);
  INFO(describe(f.events));
  check_accounting(f, o.steps, 1);
  for (const auto& e : f.events) CHECK(e.detail.find("a late echo") == std::string::npos);
  CHECK(!f.told("a late echo"));
}

/// Every set of up to three victims at every point, with and without periodic checkpoints, with
/// digests every step (as the tests run) and every 3rd (as jobs do, every 100th by default).
void sweep_losses(int nodes) {
  for (std::uint64_t every : {0u, 2u})
    for (const auto& victims : victim_sets(nodes, 3))
      for (const auto& p : points(5, every))
        for (std::uint64_t digests : {1u, 3u})
          sweep_case({.nodes = nodes, .steps = 5, .checkpoint_every = every, .digest_every = digests}, victims, p);
}

}  // namespace

TEST_CASE("failure sweep: nodes lost at every point of a step on six nodes: each step committed once") {
  // Two pipelines of three: one loss or two leave enough nodes unless a layer loses every holder;
  // three (a whole pipeline and more) make the policy stop.
  sweep_losses(6);
}

TEST_CASE("failure sweep: nodes lost at every point of a step on four nodes, too few left: checkpoint and stop, each step once") {
  // Two pipelines of two: any loss leaves fewer than (f + 1) * n0 = 4.
  sweep_losses(4);
}

TEST_CASE("failure sweep: a second loss while the recovery from the first needs it: each step committed once") {
  // Six nodes: the first loss is survived, the second hits the forming of the next epoch (or, when
  // the two leave too few, the checkpoint before the stop). Four nodes: any first loss stops the
  // job, and the second hits its checkpoint's writers.
  for (int nodes : {6, 4})
    for (std::int64_t first = 0; first < nodes; ++first)
      for (const auto& p : points(4, 0))
        for (const auto& second : victim_sets(nodes, 2)) {
          if (std::find(second.begin(), second.end(), first) != second.end()) continue;
          two_round_case(nodes, 4, {first}, p, second);
        }
}

TEST_CASE("failure sweep: the same without run-ahead, and on nodes of two slots") {
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 2))
      for (const auto& p : points(4, 2)) {
        sweep_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2, .run_ahead = false}, victims, p);
        sweep_case({.nodes = nodes, .steps = 4, .slots = 2, .checkpoint_every = 2}, victims, p);
      }
}

TEST_CASE("failure sweep: losses with evaluation rounds, and with a node whose stage fails a step every time") {
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 2))
      for (const auto& p : points(5, 0)) {
        sweep_case({.nodes = nodes, .steps = 5, .eval_every = 2, .eval_windows = 4}, victims, p);
        // Node `bad` answers step 3 with a stage error in every epoch: the step is retried, and
        // the job stops as failed if nothing else changes.
        for (std::int64_t bad = 0; bad < nodes; bad += 3)
          if (std::find(victims.begin(), victims.end(), bad) == victims.end())
            sweep_case({.nodes = nodes, .steps = 5}, victims, p, {{bad, [](fake_stage_record& r) { r.fail_step = 3; }}});
      }
}

TEST_CASE("failure sweep: losses while nodes join") {
  // As many join as die, at the same moment: on four nodes the job goes on instead of stopping
  // once they are in.
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 2))
      for (const auto& p : points(5, 2))
        sweep_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, victims, p, {}, static_cast<int>(victims.size()));
}

TEST_CASE("failure sweep: nodes that hang at every point of a step: the deadlines end it, each step committed once") {
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 2))
      for (const auto& p : points(4, 2)) hang_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2}, victims, p);
}

TEST_CASE("failure sweep: losses below the minimum in a job that waits for nodes: it resumes, each step once or again after its checkpoint") {
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 3))
      for (std::uint64_t every : {0u, 2u})
        for (const auto& p : points(5, every))
          for (const bool survivor_dies : {false, true})
            wait_case({.nodes = nodes, .steps = 5, .checkpoint_every = every}, victims, p, survivor_dies);
}

TEST_CASE("failure sweep: the coordinator cut off from every node at every point of a step: it adopts them back, each step once") {
  for (int nodes : {6, 4})
    for (std::int64_t held : {0, 1})
      for (const auto& p : points(5, 2)) {
        freeze_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, held, p);
        for (std::int64_t gone = 0; gone < nodes; ++gone)
          if (gone != held) freeze_case({.nodes = nodes, .steps = 5, .checkpoint_every = 2}, held, p, gone);
      }
}

TEST_CASE("failure sweep: the coordinator killed at every point of a step and replaced: it adopts the job, each step once") {
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

TEST_CASE("failure sweep: a node's stage fails at every point of a step: a strike or an eviction, each step committed once") {
  for (int nodes : {6, 4})
    for (std::int64_t held : {0, 1})
      for (const auto& p : points(4, 2))
        for (std::int64_t faulty = 0; faulty < nodes; ++faulty)
          for (const bool in_commit : {false, true})
            fault_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2}, held, p, faulty, in_commit);
}

TEST_CASE("failure sweep: hangs, a cut-off coordinator and a replaced one, without run-ahead and on nodes of two slots") {
  for (int nodes : {6, 4})
    for (const auto& p : points(4, 2))
      for (const bool run_ahead : {false, true})
        for (const int slots : {1, 2}) {
          if (run_ahead && slots == 1) continue;  // the cases above
          const fixture::options o{.nodes = nodes, .steps = 4, .slots = slots, .checkpoint_every = 2, .run_ahead = run_ahead};
          for (std::int64_t held : {0, 1}) {
            hang_case(o, {held}, p);
            freeze_case(o, held, p);
            replacement_case(o, held, p);
          }
        }
}

TEST_CASE("failure sweep: late copies of old messages at every point of a step change nothing") {
  for (int nodes : {6, 4})
    for (const auto& p : points(4, 2))
      for (std::int64_t held : {0, 1}) echo_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2}, held, p);
}
