// The training protocol on CAF's deterministic scheduler (fixture: protocol_fixture.hpp), with the
// real coordinator, pipeline and monitor actors and fake stages (no LibTorch): epoch formation,
// steps and commits as a trace, nodes of several slots, stale messages dropped and counted, a
// stage error that stops the job instead of hanging it, and recovery from a node lost mid-step.

#include <doctest/doctest.h>

#include <map>
#include <set>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::messages;
using namespace oobleck::testing;

TEST_CASE("step protocol: an epoch forms, every step runs on every stage and commits everywhere") {
  fixture f(fixture::roomy(4, 2));
  for (int i = 0; i < 4; ++i) f.add_worker({.name = "w" + std::to_string(i)});
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 1, .step = 0}));
  CHECK(f.happened({.kind = event_kind::epoch_formed, .epoch = 1, .step = 0}));
  CHECK(f.position({.kind = event_kind::epoch_formed}) < f.position({.kind = event_kind::step_committed}));
  CHECK(f.happened(finished(2)));
  REQUIRE(f.records.size() == 2);
  int used = 0;
  for (const auto& [id, rec] : f.stages) {
    if (rec->assignment().rank == oobleck::planning::no_rank) continue;
    ++used;
    REQUIRE(rec->steps.size() == 2);
    CHECK(rec->steps[0].step == 0);
    CHECK(rec->steps[1].step == 1);
    CHECK(rec->commits.size() == 2);
  }
  CHECK(used >= 2);
  // The pipelines' microbatch ranges tile the global batch (8 / 2 = 4 microbatches) exactly once.
  std::map<std::int32_t, std::int32_t> ranges;  // first -> count, one per pipeline
  for (const auto& [id, rec] : f.stages)
    if (!rec->steps.empty()) ranges[rec->steps[0].first_microbatch] = rec->steps[0].microbatches;
  std::int32_t next = 0;
  for (auto [first, count] : ranges) {
    CHECK(first == next);
    next += count;
  }
  CHECK(next == 4);
  CHECK(f.records[0].samples == 8);
  CHECK(f.records[0].loss == doctest::Approx(2.0));
  CHECK(f.records[1].layer_digests.size() == 6);
  for (const auto& [layer, digests] : f.records[1].layer_digests) CHECK(digests.size() == f.records[1].pipelines.size());
  // Every committed step was published with its loss, in order.
  const auto committed = all_of(f.events, {.kind = event_kind::step_committed});
  REQUIRE(committed.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(committed[k].step == k);
    CHECK(committed[k].loss == doctest::Approx(f.records[k].loss));
  }
}

TEST_CASE("slots: a worker of two slots runs two stages of its pipeline, one stage actor each") {
  fixture f(fixture::roomy(2, 2, 2));
  f.add_worker({.name = "w0", .slots = 2});
  f.add_worker({.name = "w1", .slots = 2});
  f.sched.run();
  CHECK(f.happened(finished(2)));
  REQUIRE(f.records.size() == 2);
  REQUIRE(f.stages.size() == 2);
  for (std::int64_t n = 0; n < 2; ++n) {
    CAPTURE(n);
    const auto& first = *f.stages.at(n);
    REQUIRE(first.runners.size() == 1);
    const auto& second = *first.runners[0];
    // The planner put both stages of a one-node pipeline on the node, each of width 1 ...
    REQUIRE(first.assignment().stages.size() == 2);
    const auto& a = first.assignment().stages;
    CHECK(a[0].stage == 0);
    CHECK(a[1].stage == 1);
    CHECK(a[0].width == 1);
    CHECK(a[1].width == 1);
    CHECK(a[0].end_layer == a[1].first_layer);
    CHECK(a[0].next_rank == first.assignment().rank);  // its neighbour is on the node itself
    CHECK(a[1].prev_rank == first.assignment().rank);
    // ... and each stage's steps went to its own slot's actor; the node commits once.
    CHECK(first.steps.size() == 2);
    CHECK(second.steps.size() == 2);
    CHECK(first.commits.size() == 2);
    CHECK(second.commits.empty());
    CHECK(second.epochs().empty());  // only slot 0 forms the node's epoch
  }
  // Both pipelines' last stages reported their loss; every layer has a digest from both holders.
  CHECK(f.records[0].loss == doctest::Approx(2.0));
  CHECK(f.records[1].layer_digests.size() == 6);
  for (const auto& [layer, digests] : f.records[1].layer_digests) CHECK(digests.size() == 2);
}

TEST_CASE("slots: a worker whose slots differ from the job's is refused, and the job goes on") {
  fixture f(fixture::roomy(2, 3, 2));
  f.add_worker({.name = "w0", .slots = 2});
  auto odd = f.add_worker({.name = "one-slot", .slots = 1}).handle;
  f.self->monitor(odd);
  f.sched.run();
  INFO(describe(f.events));
  const auto refused = all_of(f.events, {.kind = event_kind::node_refused});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].detail.rfind("one-slot: wrong_slots: the worker has 1 slot(s), the job's nodes have 2", 0) == 0);
  CHECK(!f.happened({.kind = event_kind::node_joined, .detail = "one-slot"}));
  // The refused worker's monitor ends with the coordinator's reason.
  std::string reason;
  f.self->receive([&](caf::down_msg& dm) { reason = describe(dm.reason); });
  CHECK(reason.rfind("wrong_slots: ", 0) == 0);
  CHECK(f.status().state == "registering");  // still waiting for its 2nd node
  f.add_worker({.name = "w1", .slots = 2});
  f.sched.run();
  CHECK(f.happened(finished(3)));
}

TEST_CASE("slots: an epoch that gives a node more stages than it has slots is a node fault, not a crash") {
  fixture f(fixture::roomy(2, 2, 2));  // one worker of the 2 comes: the job waits, the worker is admitted
  auto& w = f.add_worker({.name = "w0", .slots = 2});
  f.sched.run();
  REQUIRE(w.node == 0);
  const auto dropped = f.status().dropped_messages;
  epoch_assignment a;
  a.epoch = 99;
  a.term = 1;  // the coordinator's (an assignment of an older term is refused before anything else)
  a.rank = oobleck::planning::rank{0};
  a.peers = {{"127.0.0.1", 5000}};
  a.stages.resize(3);
  caf::anon_send(w.handle, a);
  f.sched.run();
  // The monitor did not hand the epoch to its stages (they never form it) and is still running; what
  // it sent the coordinator instead (its node_fault; the coordinator trains no epoch 99) was dropped.
  CHECK(f.stages.at(0)->epochs().empty());
  CHECK(f.alive(w.handle));
  CHECK(f.status().dropped_messages == dropped + 1);
  CHECK(f.status().state == "registering");
}

TEST_CASE("step protocol: messages of another epoch or step are dropped and counted") {
  fixture f(fixture::roomy(2, 5));
  for (int i = 0; i < 2; ++i)
    f.add_worker({.name = "w" + std::to_string(i), .setup = [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }});
  f.sched.run();
  REQUIRE(f.records.size() == 1);  // step 1 is held by the stages
  const auto before = f.status();
  CHECK(before.state == "training");
  CHECK(before.committed_steps == 1);
  caf::anon_send(f.coord, pipeline_done{before.epoch + 7, 1, 0, 1.0, ""});  // another epoch
  caf::anon_send(f.coord, pipeline_done{before.epoch, 0, 0, 1.0, ""});      // an old step
  caf::anon_send(f.coord, step_committed{before.epoch, 0, 0, {}});          // an old commit
  caf::anon_send(f.coord, node_ready{before.epoch, 0, {}});                 // a duplicate ready
  f.sched.run();
  const auto after = f.status();
  CHECK(after.dropped_messages == before.dropped_messages + 4);
  CHECK(after.committed_steps == 1);
  CHECK(after.state == "training");
  CHECK(f.records.size() == 1);
  CHECK(!f.happened({.kind = event_kind::step_failed}));
}

TEST_CASE("step protocol: a stage error re-forms the epoch, and one that repeats stops the job instead of hanging") {
  fixture f(fixture::roomy(2, 5));
  f.add_worker({.name = "w0", .setup = [](fake_stage_record& r) { r.fail_step = 2; }});
  f.add_worker({.name = "w1", .setup = [](fake_stage_record& r) { r.fail_step = 2; }});
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.records.size() == 2);
  // Each failure of step 2 (no node lost) forms the epoch again on the same nodes, and step 2 runs
  // again in it; after the 4th in a row the job stops as failed, with 2 steps committed.
  const auto failures = all_of(f.events, {.kind = event_kind::step_failed, .step = 2});
  CHECK(failures.size() == 4);
  for (const auto& e : failures) CHECK(e.detail.find("injected stage failure") != std::string::npos);
  const auto reformed = all_of(f.events, {.kind = event_kind::epoch_forming, .step = 2, .lost = {{}}, .joined = {{}}});
  CHECK(reformed.size() == 3);
  const auto& stop = f.stop();
  CHECK(stop.outcome == stop_outcome::failed);
  CHECK(stop.committed == 2);
  CHECK(stop.step == 2);
  CHECK(!f.happened({.kind = event_kind::node_lost}));
  // The failed step was never committed anywhere.
  for (const auto& [id, rec] : f.stages) CHECK(rec->commits.size() == 2);
}

TEST_CASE("recovery: a node lost in the middle of a step: survivors abort, a new epoch forms, the step runs again") {
  fixture f(fixture::roomy(4, 5));
  std::vector<monitor_actor> m;
  for (int i = 0; i < 4; ++i)
    m.push_back(f.add_worker({.name = "w" + std::to_string(i), .setup = [i](fake_stage_record& r) {
                               if (i == 3) r.hold_step = std::pair{1u, 1u};  // node 3 never finishes step 1 of the first epoch
                             }}).handle);
  f.sched.run();
  REQUIRE(f.records.size() == 1);
  REQUIRE(f.status().state == "training");
  caf::anon_send_exit(m[3], caf::exit_reason::kill);  // its process dies
  f.sched.run();
  INFO(describe(f.events));
  // Node 3 lost during step 1, the policy re-formed the job without it (epoch 2), and step 1 ran
  // again there: the events in this order.
  const auto lost = f.position({.kind = event_kind::node_lost, .step = 1, .node = 3});
  const auto forming = f.position({.kind = event_kind::epoch_forming, .epoch = 2, .step = 1, .lost = {{3}}});
  const auto formed = f.position({.kind = event_kind::epoch_formed, .epoch = 2, .step = 1});
  const auto rerun = f.position({.kind = event_kind::step_committed, .epoch = 2, .step = 1});
  CHECK(lost < forming);
  CHECK(forming < formed);
  CHECK(formed < rerun);
  CHECK(rerun < f.events.size());
  CHECK(f.happened(finished(5)));
  REQUIRE(f.records.size() == 5);
  for (std::size_t k = 0; k < 5; ++k) CHECK(f.records[k].step == k);
  CHECK(f.records[0].epoch == 1);
  CHECK(f.records[1].epoch == 2);  // step 1 committed in the new epoch
  for (std::size_t k = 1; k < 5; ++k)
    for (const auto& p : f.records[k].pipelines)
      for (auto n : p.nodes) CHECK(n != oobleck::planning::node_id{3});  // ... on the survivors
  for (std::int64_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const auto& rec = *f.stages.at(i);
    REQUIRE(!rec.aborted().empty());
    CHECK(rec.aborted().front() == 1);  // the old epoch's data plane, at once (later: the shutdown)
    CHECK(rec.epochs() == std::vector<std::uint64_t>{1, 2});
  }
}

TEST_CASE("recovery: a commit decided before the loss stands, and the next step runs in the new epoch") {
  fixture f(fixture::roomy(4, 4));
  std::vector<monitor_actor> m;
  for (int i = 0; i < 4; ++i)
    m.push_back(f.add_worker({.name = "w" + std::to_string(i), .setup = [i](fake_stage_record& r) {
                               if (i == 2) r.hold_commit = std::pair{1u, 1u};  // node 2 dies while applying the commit of step 1
                             }}).handle);
  f.sched.run();
  REQUIRE(f.status().state == "committing");
  caf::anon_send_exit(m[2], caf::exit_reason::kill);
  f.sched.run();
  INFO(describe(f.events));
  // The commit of step 1 stood (published once, before the new epoch), and the new epoch runs
  // step 2 next, not step 1 again.
  const auto stood = f.position({.kind = event_kind::commit_stood, .epoch = 1, .step = 1, .node = 2});
  CHECK(stood < f.position({.kind = event_kind::epoch_forming, .epoch = 2, .step = 2, .lost = {{2}}}));
  CHECK(f.position({.kind = event_kind::epoch_forming, .epoch = 2}) < f.events.size());
  CHECK(!f.happened({.kind = event_kind::epoch_forming, .step = 1}));
  CHECK(count(f.events, {.kind = event_kind::step_committed, .step = 1}) == 1);
  CHECK(f.happened(finished(4)));
  // Every survivor applied the commit of step 1 exactly once, and never re-ran step 1.
  for (std::int64_t i : {0, 1, 3}) {
    CAPTURE(i);
    const auto& rec = *f.stages.at(i);
    if (!rec.steps.empty()) CHECK(rec.runs_of(1) == 1);
    CHECK(rec.commits_of(1) == 1);
  }
}

TEST_CASE("terms: a monitor refuses an epoch assignment of an older coordinator term than it has seen") {
  // Admitted by a coordinator of term 1: an assignment of term 0 (a coordinator that was replaced)
  // never reaches the node's stages; the same assignment with the term it knows does.
  fixture f(fixture::roomy(2, 2, 2));
  auto& w = f.add_worker({.name = "w0", .slots = 2});
  f.sched.run();
  REQUIRE(w.node == 0);
  epoch_assignment a;
  a.epoch = 99;
  a.term = 0;
  a.rank = oobleck::planning::rank{0};
  a.peers = {{"127.0.0.1", 5000}};
  a.stages.resize(3);  // more than its slots: a node fault if it were taken
  caf::anon_send(w.handle, a);
  f.sched.run();
  const auto dropped = f.status().dropped_messages;
  CHECK(f.stages.at(0)->epochs().empty());
  a.term = 1;
  caf::anon_send(w.handle, a);
  f.sched.run();
  CHECK(f.status().dropped_messages == dropped + 1);  // its node_fault reached the coordinator this time
}

TEST_CASE("digests where the replicas are checked: every Nth step, the first commit of every epoch and the last step") {
  // digest_every = 4 over nine steps, node 0 lost in the middle of step 5: the digests come with
  // the commits of steps 0 (epoch 1's first), 4 (a multiple of 4), 5 (epoch 2's first, after the
  // reconfiguration copied layers) and 8 (the last); the stages are not asked for them otherwise.
  fixture f({.steps = 9, .digest_every = 4});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 5u}; }}});
  REQUIRE(f.records.size() == 5);
  f.kill(0);
  f.sched.run();
  INFO(describe(f.events));
  REQUIRE(f.happened(finished(9)));
  REQUIRE(f.records.size() == 9);
  const std::set<std::uint64_t> checked{0, 4, 5, 8};
  for (const auto& r : f.records) {
    CAPTURE(r.step);
    if (!checked.count(r.step)) {
      CHECK(r.layer_digests.empty());
      continue;
    }
    CHECK(r.layer_digests.size() == 6);
    for (const auto& [layer, digests] : r.layer_digests) CHECK(digests.size() == r.pipelines.size());
  }
  // What each stage was asked.
  for (const auto& [id, rec] : f.stages)
    for (const auto& c : rec->commits) {
      CAPTURE(c.step);
      CHECK(c.digests == (checked.count(c.step) == 1));
    }
}
