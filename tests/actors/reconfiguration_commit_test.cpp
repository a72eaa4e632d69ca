// A loss while a step's commit is applied (fixture: protocol_fixture.hpp): the commit
// stands, is recorded and applied before the next epoch, is never re-run, and a loss during the
// last step's commit ends the job without a new epoch.

#include <doctest/doctest.h>

#include <cstdint>
#include <utility>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
namespace planning = oobleck::planning;

TEST_CASE("reconfiguration protocol: a loss during a commit: the commit stands, is applied before the next epoch, and is not re-run") {
  // Every pipeline reported step 1, the coordinator decided the commit; node 2 dies while applying
  // it (its step_committed never comes). The survivors apply the commit of step 1 (the stage gets
  // it before the next epoch's assignment), step 1 is never run again, step 2 runs in epoch 2.
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps});
  f.kill_during_commit(2, {1, 1});
  const auto r = f.lose(f.initial(), {2});
  INFO(describe(f.events));
  // The commit of step 1 stood, then the policy's epoch 2 (without node 2) runs step 2 next.
  const auto stood = f.position({.kind = event_kind::commit_stood, .epoch = 1, .step = 1, .node = 2});
  const auto forming = f.position({.kind = event_kind::epoch_forming, .epoch = 2, .step = 2, .detail = rules_of(r), .lost = {{2}}});
  CHECK(stood < forming);
  CHECK(forming < f.events.size());
  CHECK(f.happened({.kind = event_kind::epoch_formed, .epoch = 2, .step = 2}));
  CHECK(f.happened(finished(4)));
  CHECK(f.copies_of(2) == fixture::copies_of(r));
  for (const auto& [id, rec] : f.stages) {
    if (id == 2) continue;
    CAPTURE(id);
    CHECK(rec->commits_of(1) == 1);
    CHECK(rec->runs_of(1) == 1);
    REQUIRE(rec->traced("commit 1 1"));
    REQUIRE(rec->traced("assign 2"));
    CHECK(rec->position("commit 1 1") < rec->position("assign 2"));  // applied before the next epoch
    // Step 2 runs in epoch 2; in epoch 1 only its orders that rode with the commit of step 1
    // (run-ahead), whose result died with the epoch.
    for (const auto& s : rec->steps)
      if (s.step >= 2) CHECK((s.epoch == 2 || (s.epoch == 1 && s.step == 2 && s.commit_first)));
    if (!rec->assignments.at(2).stages.empty()) CHECK(rec->runs_of(2, 2) == 1);
  }
  // Steps 2 and 3 committed in epoch 2 on the policy's pipelines.
  REQUIRE(f.records.size() >= 2);
  CHECK(f.records.back().step == 3);
  CHECK(f.records.back().epoch == 2);
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].resumed_step == 2);
}

// Was a bug (fixed): a step whose commit was decided when a node is lost (state "committing") is counted
// (st.committed, st.step move on) but never reported: no step_record reaches on_step, so
// --metrics-out has no line for it and no "step K: loss ..." line is printed
// (coordinator_training.cpp, recover(): the "committing" branch only logs "step K was committed
// before node N was lost"). Here, with node 2 lost while applying the commit of step 1, records
// hold steps 0, 2 and 3: the loss of step 1 (known: every pipeline reported it) and the survivors'
// digests are lost, and ARCHITECTURE.md §5's "every committed step consumed exactly B samples" cannot be
// checked for it. README: "Each committed step prints `step K: ...`; with --metrics-out one JSON
// line per step". Expected: a record for step 1 with its loss, B samples and the digests of the
// survivors (or of every holder that replied).
TEST_CASE("reconfiguration protocol: a loss during a commit: the committed step still has its record") {
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps});
  f.kill_during_commit(2, {1, 1});
  REQUIRE(f.happened(finished(4)));
  CHECK(count(f.events, {.kind = event_kind::step_committed, .step = 1}) == 1);
  REQUIRE(f.records.size() == steps);
  for (std::size_t k = 0; k < steps; ++k) {
    CHECK(f.records[k].step == k);
    CHECK(f.records[k].samples == 16);
  }
}

TEST_CASE("reconfiguration protocol: a loss during the last step's commit ends the job, without a new epoch") {
  constexpr std::uint64_t steps = 3;
  fixture f({.steps = steps});
  f.kill_during_commit(4, {1, 2});
  INFO(describe(f.events));
  CHECK(f.happened({.kind = event_kind::commit_stood, .epoch = 1, .step = 2, .node = 4}));
  CHECK(f.happened(finished(3)));
  CHECK(count(f.events, {.kind = event_kind::epoch_forming}) == 1);  // the first plan's only
  for (const auto& [id, rec] : f.stages) {
    if (id == 4) continue;
    CHECK(!rec->traced("assign 2"));
    CHECK(rec->traced("commit 1 2"));
  }
}

TEST_CASE("reconfiguration protocol: a loss during a commit, then another while the next epoch forms") {
  // Node 2 dies applying the commit of step 1; node 3 never finishes forming epoch 2 and dies
  // too. The commit stands; epoch 3 is planned from epoch 1 without 2 and 3; step 2 runs there.
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps});
  f.kill_during_commit(2, {1, 1}, {{3, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  REQUIRE(f.status().state == "forming");
  f.kill(3);
  f.sched.run();
  const auto both = f.lose(f.initial(), {2, 3});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  INFO(describe(f.events));
  CHECK(f.happened({.kind = event_kind::commit_stood, .epoch = 1, .step = 1, .node = 2}));
  CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 3, .step = 2, .detail = rules_of(both), .lost = {{2, 3}}}));
  CHECK(f.happened(finished(4)));
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  for (const auto& [id, rec] : f.stages) {
    if (id == 2 || id == 3) continue;
    CHECK(rec->commits_of(1) == 1);
    CHECK(rec->runs_of(2, 3) == (rec->assignments.at(3).stages.empty() ? 0u : 1u));
    CHECK(rec->runs_of(2, 2) == 0);  // epoch 2 never formed
  }
  REQUIRE(!f.records.empty());
  CHECK(f.records.back().step == 3);
  CHECK(f.records.back().epoch == 3);
}
