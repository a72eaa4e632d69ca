// Losses at every point of a step, swept (fixture: protocol_fixture.hpp; shared parts:
// failure_sweep.hpp; the coordinator's own losses: coordinator_loss_sweep_protocol_test.cpp): one,
// two or three nodes die while the first epoch forms, while a step runs, while its commit is
// applied or while a periodic checkpoint is written, on jobs where the survivors go on (six nodes)
// and where they are too few (four nodes: checkpoint and stop); then the same with a second round
// of losses while the recovery needs those nodes (forming the next epoch, writing the stop's
// checkpoint), without run-ahead, on nodes of two slots, with evaluation rounds, with a node whose
// stage fails a step every time, with nodes joining as others die, with nodes that hang instead of
// dying (the deadlines end it), in jobs that wait for nodes below their minimum and resume from
// memory or from a checkpoint, with a node's own stage failing (a strike, or an eviction when
// applying a commit), and with late copies of old messages. Whatever happens, the accounting must
// hold: every step committed once, in order (after a resume from an older checkpoint, again from
// its step); a checkpoint holds the state the next step starts from; the job ends once and its stop
// counts what was committed. The single cases in reconfiguration_*_test.cpp check what happens;
// this checks that nothing is counted twice, skipped or left hanging anywhere. The two sweeps found
// seven bugs: a commit that stood through a loss was recorded twice when the policy then said
// checkpoint and stop; that stop waited for a periodic checkpoint abandoned for the same loss (a
// hang here); a commit the coordinator was confirming when it lost every node had no record once it
// adopted them back; an adopted job too small to go on went to its fallback checkpoint along an
// edge the phase machine did not have; nodes lost before anything trained (while the first epoch
// formed, the coordinator cut off then, or a replacement's nodes that had committed nothing) failed
// the job when too few were left to plan it; and a stage failure of epoch 0, or of an epoch not
// assigned yet, counted as a strike.

#include <doctest/doctest.h>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/failure_sweep.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
namespace messages = oobleck::messages;
namespace planning = oobleck::planning;

namespace {

/// Runs the job `o` (with checkpoints: every o.checkpoint_every steps, or only the policy's),
/// kills `victims` at `point`, and checks the accounting.
void sweep_case(fixture::options o, const std::vector<std::int64_t>& victims, failure_point point,
                const fixture::setup_map& also = {}, int joins = 0) {
  o.checkpoints = true;
  const std::uint64_t steps = o.steps;
  const std::string name = case_name(victims, point, o) + (joins > 0 ? ", " + std::to_string(joins) + " joining" : "");
  CAPTURE(name);
  fixture f(o);
  f.start(holding(victims, point, also));
  if (!also.empty() && f.happened({.kind = event_kind::stopped})) return;  // the injected errors ended it first
  if (!stands_at(f, victims, point)) return;
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
  fixture::setup_map setup = holding(first, point);
  for (auto v : second)
    setup[v] = [](fake_stage_record& r) {
      r.hold_form = {2};
      r.hold_write = true;
    };
  f.start(setup);
  REQUIRE(stands_at(f, first, point));
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

/// Victims that hang instead of dying: their stages hold their answer at `point` and never give
/// it (a step, a commit, a checkpoint write), and the coordinator's deadlines must end it (the
/// step runs again, a late commit's node is evicted, a writer is replaced). Simulated time passes
/// a second at a time until the job ends.
void hang_case(fixture::options o, const std::vector<std::int64_t>& victims, failure_point point) {
  o.checkpoints = true;
  const std::string name = case_name(victims, point, o) + ", hanging";
  CAPTURE(name);
  fixture f(o);
  f.start(holding(victims, point));
  run_until_stopped(f);
  INFO(describe(f.events));
  check_accounting(f, o.steps, 1, true);
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
  f.start(holding(victims, point));
  if (!stands_at(f, victims, point)) return;
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

/// A node's own stage fails (node_fault, as its monitor reports an exception: out of memory) while
/// node `held`'s stage holds its answer at `point`: a strike and the step again, or, applying a
/// commit (`in_commit`), an eviction. Simulated time passes until the job ends.
void fault_case(fixture::options o, std::int64_t held, failure_point point, std::int64_t faulty, bool in_commit) {
  o.checkpoints = true;
  const std::string name = case_name({held}, point, o) + "; node " + std::to_string(faulty) +
                           (in_commit ? " fails applying a commit" : " fails its step");
  CAPTURE(name);
  fixture f(o);
  f.start(holding({held}, point));
  if (!stands_at(f, {held}, point)) return;
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

TEST_CASE("failure sweep: nodes that hang, without run-ahead and on nodes of two slots") {
  for (const auto& o : variant_jobs())
    for (const auto& p : points(o.steps, o.checkpoint_every))
      for (std::int64_t held : {0, 1}) hang_case(o, {held}, p);
}

TEST_CASE("failure sweep: losses below the minimum in a job that waits for nodes: it resumes, each step once or again after its checkpoint") {
  for (int nodes : {6, 4})
    for (const auto& victims : victim_sets(nodes, 3))
      for (std::uint64_t every : {0u, 2u})
        for (const auto& p : points(5, every))
          for (const bool survivor_dies : {false, true})
            wait_case({.nodes = nodes, .steps = 5, .checkpoint_every = every}, victims, p, survivor_dies);
}

TEST_CASE("failure sweep: a node's stage fails at every point of a step: a strike or an eviction, each step committed once") {
  for (int nodes : {6, 4})
    for (std::int64_t held : {0, 1})
      for (const auto& p : points(4, 2))
        for (std::int64_t faulty = 0; faulty < nodes; ++faulty)
          for (const bool in_commit : {false, true})
            fault_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2}, held, p, faulty, in_commit);
}

TEST_CASE("failure sweep: late copies of old messages at every point of a step change nothing") {
  for (int nodes : {6, 4})
    for (const auto& p : points(4, 2))
      for (std::int64_t held : {0, 1}) echo_case({.nodes = nodes, .steps = 4, .checkpoint_every = 2}, held, p);
}
