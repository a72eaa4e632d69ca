// Stage faults in the protocol (ARCHITECTURE.md §5 "Stage faults"), on the deterministic scheduler
// with fake stages (protocol_fixture.hpp): every wait of the coordinator has a deadline whose
// expiry is handled like any other fault. A step past its deadline: the stall probe names the
// stage that computes while its peers wait, the epoch is formed again and the step runs again; the
// same culprit a second time is evicted. A commit not confirmed in time: the commit stands and
// the late node is evicted. An epoch that does not form in time: the node that could not start
// forming it is named. A deadline that does not come from the coordinator's own timer is dropped.

#include <doctest/doctest.h>

#include <chrono>

#include "actors/protocol_fixture.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

/// The step deadline of a job with no committed step yet is first_step_deadline_ms (60 s by
/// default); with committed steps of a few ms it is step_deadline_min_ms (10 s), plus 10 s for the
/// first step of an epoch. The stall probe's answers come at once here.
void pass(fixture& f, std::chrono::seconds s) {
  f.sched.advance_time(s);
  f.sched.run();
}

bool evicted(const fixture& f, std::int64_t node) {
  for (const auto& e : all_of(f.events, {.kind = event_kind::node_lost, .node = node}))
    if (e.detail.rfind("evicted: ", 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("stage faults: a step past its deadline: the probe names the stage computing while its peers wait, and the step runs again") {
  fixture f(fixture::roomy(4, 3));
  f.start({{1, [](fake_stage_record& r) {
              r.hold_step = std::pair{1u, 1u};
              r.computing_ms = 20'000;
            }}});
  REQUIRE(f.happened({.kind = event_kind::step_committed, .step = 0}));
  CHECK(!f.happened({.kind = event_kind::step_failed}));
  pass(f, std::chrono::seconds(9));  // not yet
  CHECK(!f.happened({.kind = event_kind::step_failed}));
  pass(f, std::chrono::seconds(2));
  const auto failed = f.position({.kind = event_kind::step_failed, .epoch = 1, .step = 1, .node = 1});
  REQUIRE(failed < f.events.size());
  CHECK(f.events[failed].detail.find("node 1 has been computing for 20000 ms while its peers wait") != std::string::npos);
  // Formed again on the same nodes (nobody lost), step 1 runs again and the job finishes.
  CHECK(f.position({.kind = event_kind::epoch_forming, .epoch = 2, .step = 1, .lost = std::vector<std::int64_t>{}}, failed) <
        f.events.size());
  CHECK(!f.happened({.kind = event_kind::node_lost}));
  f.check_steps(3);
  CHECK(f.stop().outcome == messages::stop_outcome::finished);
}

TEST_CASE("stage faults: the same stage stalling again is evicted: declared lost, told to exit, the job goes on without it") {
  fixture f(fixture::roomy(4, 3));
  f.start({{1, [](fake_stage_record& r) {
              r.hold_steps = {{1u, 1u}, {2u, 1u}};
              r.computing_ms = 30'000;
            }}});
  pass(f, std::chrono::seconds(11));
  REQUIRE(f.happened({.kind = event_kind::step_failed, .epoch = 1, .step = 1, .node = 1}));
  // Epoch 2 formed; node 1 stalls step 1 again (the first step of an epoch gets 10 s more).
  CHECK(f.happened({.kind = event_kind::epoch_formed, .epoch = 2}));
  CHECK(!evicted(f, 1));
  pass(f, std::chrono::seconds(21));
  CHECK(f.happened({.kind = event_kind::step_failed, .epoch = 2, .step = 1, .node = 1}));
  CHECK(evicted(f, 1));
  CHECK(!f.alive(f.monitors.at(1)));  // its monitor was told to exit
  CHECK(f.happened(reconfigured({1})));
  f.check_steps(3);
  CHECK(f.stop().outcome == messages::stop_outcome::finished);
}

TEST_CASE("stage faults: a commit not confirmed in time stands, and the late node is evicted") {
  fixture f(fixture::roomy(4, 3));
  f.start({{2, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }}});
  REQUIRE(f.happened({.kind = event_kind::step_committed, .step = 0}));
  CHECK(!f.happened({.kind = event_kind::step_committed, .step = 1}));
  pass(f, std::chrono::seconds(11));
  CHECK(evicted(f, 2));
  CHECK(f.happened({.kind = event_kind::commit_stood, .epoch = 1, .step = 1, .node = 2}));
  // Every step committed once (step 1's record holds the digests of the nodes that confirmed).
  for (std::uint64_t k = 0; k < 3; ++k) CHECK(count(f.events, {.kind = event_kind::step_committed, .step = k}) == 1u);
  CHECK(f.stop().outcome == messages::stop_outcome::finished);
}

TEST_CASE("stage faults: while a commit's acknowledgements come in, a node's failed step is a strike and its failed commit an eviction") {
  // With run-ahead a node runs step k + 1 as soon as it applied commit k, while the coordinator
  // still waits for other nodes' acknowledgements of commit k (node 2 holds its own here). A
  // failure of that step must count as a step's (a strike, the epoch formed again), not as a commit
  // torn part-way (eviction): the chaos run of seed 9 evicted a node for an error injected into its
  // step. And it waits for the acknowledgements still to come: the commit's record then holds every
  // node's digests (chaos seed 9 again: a record with the digests of five nodes of eight, three of
  // them alive and about to reply).
  for (const bool in_commit : {false, true}) {
    CAPTURE(in_commit);
    fixture f(fixture::roomy(4, 3));
    f.start({{2, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }}});
    REQUIRE(f.happened({.kind = event_kind::step_committed, .step = 0}));
    REQUIRE(f.status().state == "committing");
    caf::send_as(f.monitors.at(0), f.coord, messages::node_fault{1, planning::node_id{0}, "injected: out of memory", true, in_commit});
    f.sched.run();
    if (in_commit) {
      // The commit stands (it was decided) without node 0's digests; node 0 goes.
      CHECK(f.happened({.kind = event_kind::step_failed, .epoch = 1, .node = 0}));
      CHECK(f.happened({.kind = event_kind::commit_stood, .epoch = 1, .step = 1}));
      CHECK(evicted(f, 0));
      continue;
    }
    // The step's failure waits for node 2's acknowledgement.
    CHECK(f.status().state == "committing");
    CHECK(!f.happened({.kind = event_kind::step_failed}));
    messages::step_committed ack{1, 1, planning::node_id{2}, {}};  // what node 2 would have said
    for (const auto& s : f.stages.at(2)->assignments.at(1).stages)
      for (int l = s.first_layer.value; l < s.end_layer.value; ++l) ack.digests.push_back({planning::layer_index{l}, 1001u});
    caf::send_as(f.monitors.at(2), f.coord, ack);
    f.sched.run();
    const auto committed = f.position({.kind = event_kind::step_committed, .epoch = 1, .step = 1});
    REQUIRE(committed < f.events.size());
    CHECK(!f.happened({.kind = event_kind::commit_stood}));  // completed, not merely decided
    CHECK(f.position({.kind = event_kind::step_failed, .epoch = 1, .step = 2, .node = 0}, committed) < f.events.size());
    CHECK(!evicted(f, 0));
    CHECK(f.told("node 0's stage failed in epoch 1 (1 of 3 before eviction)"));
    CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 2, .step = 2, .lost = std::vector<std::int64_t>{}}));
    f.check_steps(3);
    CHECK(f.stop().outcome == messages::stop_outcome::finished);
  }
}

TEST_CASE("stage faults: an epoch that does not form in time names the node that could not start forming it") {
  fixture f(fixture::roomy(4, 2));
  f.start({{3, [](fake_stage_record& r) {
              r.hold_form = {1};
              r.forming_blocked = true;
            }}});
  CHECK(!f.happened({.kind = event_kind::epoch_formed}));
  pass(f, std::chrono::seconds(29));
  CHECK(!f.happened({.kind = event_kind::step_failed}));
  pass(f, std::chrono::seconds(2));
  const auto failed = f.position({.kind = event_kind::step_failed, .epoch = 1, .node = 3});
  REQUIRE(failed < f.events.size());
  CHECK(f.events[failed].detail.find("node 3 could not start forming it") != std::string::npos);
  CHECK(f.happened({.kind = event_kind::epoch_formed, .epoch = 2}));
  f.check_steps(2);
  CHECK(f.stop().outcome == messages::stop_outcome::finished);
}

TEST_CASE("stage faults: a deadline that is not the coordinator's own is dropped") {
  fixture f(fixture::roomy(4, 3));
  f.start({{1, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  const auto dropped = f.status().dropped_messages;
  // A stranger in the coordinator's process (or one that reaches its port) sends the step's
  // deadline and a probe deadline: without the sender check, the probe would find nobody computing
  // and fail the step.
  f.self->send(f.coord, messages::coordinator_deadline{messages::deadline_kind::step, 1, 1, 0});
  f.self->send(f.coord, messages::coordinator_deadline{messages::deadline_kind::probe, 1, 1, 1});
  f.sched.run();
  CHECK(!f.happened({.kind = event_kind::step_failed}));
  CHECK(f.status().dropped_messages >= dropped + 2);
}
