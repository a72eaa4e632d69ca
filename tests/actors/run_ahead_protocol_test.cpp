// The coordinator's run-ahead on the deterministic scheduler (fixture: protocol_fixture.hpp):
// when the step after a commit follows at once, its orders go out with the commit
// (run_step::commit_first, commit_step::with_run), so the commit's round trip leaves the step's
// critical path. Every stage gets the commit before the orders that depend on it; the step is in
// force, and recorded, only after every node acknowledged the commit; a failure meanwhile lets the
// decided commit stand and runs the step sent ahead again in the next epoch.

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::messages;
using namespace oobleck::testing;

namespace {

/// The fixture's default, spelled out: these tests are about it.
fixture::options ahead(fixture::options o) {
  o.run_ahead = true;
  return o;
}

/// The steps whose orders (not evaluation rounds) rode with their previous step's commit, on `rec`.
std::set<std::uint64_t> steps_sent_ahead(const fake_stage_record& rec) {
  std::set<std::uint64_t> out;
  for (const auto& s : rec.steps) {
    if (s.eval || !s.commit_first) continue;
    CHECK(s.commit.epoch == s.epoch);
    CHECK(s.commit.step + 1 == s.step);
    CHECK(s.commit.with_run);
    out.insert(s.step);
  }
  return out;
}

}  // namespace

TEST_CASE("run-ahead: every step after the first goes out with its previous step's commit, and is recorded after it") {
  fixture f(ahead(fixture::roomy(4, 4)));
  f.start();
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.happened(finished(4)));
  f.check_steps(4);
  int running = 0;
  for (const auto& [id, rec] : f.stages) {
    if (rec->steps.empty()) continue;
    ++running;
    CAPTURE(id);
    CHECK(steps_sent_ahead(*rec) == std::set<std::uint64_t>{1, 2, 3});
    // Each commit once; with_run on all but the last (no step follows it).
    REQUIRE(rec->commits.size() == 4);
    for (std::uint64_t k = 0; k < 4; ++k) {
      CHECK(rec->commits[k].step == k);
      CHECK(rec->commits[k].with_run == (k < 3));
    }
    // The orders of step k + 1 reach the stage after the monitor's commit of step k was sent
    // (here: the fake stage sees the commit first; a real one applies whichever comes first).
    CHECK(rec->position("commit 1 0") < rec->position("step 1 1"));
  }
  CHECK(running >= 2);
  // Wall times run from commit to commit; the breakdown of a step sent ahead starts at its orders,
  // so its parts add up to wall_ms + ahead_ms.
  for (const auto& r : f.records) {
    CAPTURE(r.step);
    const auto& b = r.breakdown;
    CHECK(b.ahead_ms >= 0);
    if (r.step == 0) CHECK(b.ahead_ms == 0);
    const double parts = b.compute_ms + b.p2p_wait_ms + b.allreduce_ms + b.optimizer_ms + b.control_ms + b.other_ms;
    CHECK(parts == doctest::Approx(r.wall_ms + b.ahead_ms).epsilon(1e-9));
  }
}

TEST_CASE("run-ahead: off, a step's orders wait for every node's acknowledgement of the commit before it") {
  auto o = fixture::roomy(4, 3);
  o.run_ahead = false;
  fixture f(o);
  f.start();
  f.sched.run();
  CHECK(f.happened(finished(3)));
  for (const auto& [id, rec] : f.stages) {
    CHECK(steps_sent_ahead(*rec).empty());
    for (const auto& c : rec->commits) CHECK(!c.with_run);
  }
}

TEST_CASE("run-ahead: a node that does not acknowledge the commit holds the step sent ahead out of the record: "
          "lost, the commit stands and that step runs again in the next epoch") {
  fixture f(ahead(fixture::roomy(4, 4)));
  std::vector<monitor_actor> m;
  for (int i = 0; i < 4; ++i)
    m.push_back(f.add_worker({.name = "w" + std::to_string(i), .setup = [i](fake_stage_record& r) {
                               if (i == 2) r.hold_commit = std::pair{1u, 1u};
                             }}).handle);
  f.sched.run();
  // Step 2's orders went out with the commit of step 1 and its stages answered, but step 1 is not
  // committed until node 2 acknowledges: the coordinator still commits, and records steps 0 only.
  REQUIRE(f.status().state == "committing");
  REQUIRE(f.records.size() == 1);
  for (std::int64_t i : {0, 1, 3})
    if (!f.stages.at(i)->steps.empty()) CHECK(f.stages.at(i)->runs_of(2, 1) == 1);
  caf::anon_send_exit(m[2], caf::exit_reason::kill);
  f.sched.run();
  INFO(describe(f.events));
  const auto stood = f.position({.kind = event_kind::commit_stood, .epoch = 1, .step = 1, .node = 2});
  CHECK(stood < f.position({.kind = event_kind::epoch_forming, .epoch = 2, .step = 2, .lost = {{2}}}));
  CHECK(count(f.events, {.kind = event_kind::step_committed, .step = 1}) == 1);
  CHECK(count(f.events, {.kind = event_kind::step_committed, .step = 2}) == 1);
  CHECK(f.happened(finished(4)));
  for (std::int64_t i : {0, 1, 3}) {
    CAPTURE(i);
    const auto& rec = *f.stages.at(i);
    CHECK(rec.commits_of(1) == 1);
    if (rec.steps.empty()) continue;
    // Step 2 ran ahead in epoch 1 (its result dropped with the epoch) and again in epoch 2, whose
    // first step is not sent ahead (a new epoch starts from its own orders).
    CHECK(rec.runs_of(2, 1) == 1);
    CHECK(rec.runs_of(2, 2) == 1);
    for (const auto& s : rec.steps)
      if (s.epoch == 2 && s.step == 2) CHECK(!s.commit_first);
  }
  REQUIRE(f.records.size() == 4);
  for (std::uint64_t k = 0; k < 4; ++k) CHECK(f.records[k].step == k);
}

TEST_CASE("run-ahead: not before an evaluation round or a checkpoint, and nothing past the last step") {
  auto o = ahead(fixture::roomy(4, 6));
  o.eval_every = 2;
  o.eval_windows = 4;
  o.checkpoint_every = 3;
  fixture f(o);
  f.start();
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.happened(finished(6)));
  f.check_steps(6);
  CHECK(f.evals.size() >= 2);    // after steps 1, 3 (and the one that ends the job)
  CHECK(!f.finished.empty());    // after step 2 (3 committed), ...
  for (const auto& [id, rec] : f.stages) {
    if (rec->steps.empty()) continue;
    CAPTURE(id);
    // Step 2 follows an evaluation round, 3 a checkpoint, 4 a round: their orders wait; 1 and 5
    // ride with their commits. The job's last commit (step 5) has no step behind it.
    CHECK(steps_sent_ahead(*rec) == std::set<std::uint64_t>{1, 5});
    std::map<std::uint64_t, bool> with_run;
    for (const auto& c : rec->commits) with_run[c.step] = c.with_run;
    CHECK(with_run == std::map<std::uint64_t, bool>{{0, true}, {1, false}, {2, false}, {3, false}, {4, true}, {5, false}});
    for (const auto& s : rec->steps) CHECK((s.step < 6 || s.eval));  // the round that ends the job only
  }
}
