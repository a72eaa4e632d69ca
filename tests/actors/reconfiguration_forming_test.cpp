// A loss while a reconfiguration forms (fixture: protocol_fixture.hpp): the half-formed
// epoch is abandoned and the next plan starts from the last configuration that formed, whether the
// second victim is a copy source or another node while a slow one still forms; and a node that
// registers meanwhile enters at the next step boundary. And what each epoch's assignments carry for
// an NCCL data plane.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using oobleck::messages::stop_outcome;
namespace messages = oobleck::messages;
namespace planning = oobleck::planning;

TEST_CASE("reconfiguration protocol: a copy source lost while the new epoch forms: planned again from the last formed epoch") {
  // Node 0 dies in the middle of step 1. Node C, a copy source of that reconfiguration, never
  // finishes forming epoch 2 (its copies hang), and then dies too. Epoch 2 must never start; the
  // coordinator plans epoch 3 from epoch 1's configuration (where the layers still are: nothing
  // of epoch 2 formed) without nodes 0 and C, and step 1 runs once, in epoch 3.
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps});
  const int a = 0;
  const int c = copy_source_to_lose(f, a);
  CAPTURE(c);
  f.start({{a, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {c, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  REQUIRE(f.records.size() == 1);
  f.kill(a);
  f.sched.run();
  const auto first = f.lose(f.initial(), {a});
  CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 2, .step = 1, .detail = rules_of(first), .lost = {{a}}}));
  REQUIRE(f.status().state == "forming");
  CHECK(f.status().epoch == 2);
  CHECK(f.copies_of(2) == fixture::copies_of(first));
  for (const auto& [id, rec] : f.stages)
    if (id != a) CHECK(rec->traced("assign 2"));

  f.kill(c);
  f.sched.run();
  const auto both = f.lose(f.initial(), {a, c});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  INFO(describe(f.events));
  const std::vector<std::int64_t> lost{a, c};
  CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 3, .step = 1, .detail = rules_of(both), .lost = lost}));
  CHECK(!f.happened({.kind = event_kind::epoch_formed, .epoch = 2}));
  CHECK(f.happened({.kind = event_kind::epoch_formed, .epoch = 3, .step = 1}));
  CHECK(f.happened(finished(4)));
  f.check_steps(steps);
  CHECK(f.records[0].epoch == 1);
  for (std::size_t k = 1; k < steps; ++k) CHECK(f.records[k].epoch == 3);
  f.check_pipelines(1, fixture::after(both));
  // The copies of epoch 3 come from the holders of epoch 1, not from anything epoch 2 moved.
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  for (const auto& [id, rec] : f.stages) {
    if (id == a || id == c) continue;
    CAPTURE(id);
    // Each survivor aborted epoch 1's data plane and then epoch 2's, before forming epoch 3,
    // and ran nothing in epoch 2.
    REQUIRE(rec->traced("abort 1"));
    REQUIRE(rec->traced("abort 2"));
    REQUIRE(rec->traced("assign 3"));
    CHECK(rec->position("abort 1") < rec->position("assign 2"));
    CHECK(rec->position("abort 2") < rec->position("assign 3"));
    for (const auto& s : rec->steps) CHECK(s.epoch != 2);
    CHECK(rec->runs_of(1, 3) == (rec->assignments.at(3).stages.empty() ? 0u : 1u));
  }
  // One recovery: from the last commit before the failure to the first commit after it.
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].epoch == 3);
  CHECK(f.recoveries[0].lost == node_ids({a, c}));
  CHECK(f.recoveries[0].action == rules_of(first) + "," + rules_of(both));  // both decisions, in order
  CHECK(f.recoveries[0].resumed_step == 1);
  // Where forming went, from the nodes' own reports: the slowest node of epoch 3 per phase.
  int top_rank = 0;
  for (const auto& [id, rec] : f.stages)
    if (rec->assignments.count(3)) top_rank = std::max(top_rank, rec->assignments.at(3).rank.value);
  CHECK(f.recoveries[0].copy_ms == doctest::Approx((100 + 1000 * top_rank) / 1000.0));
  CHECK(f.recoveries[0].copy_wait_ms == doctest::Approx((50 + 10 * top_rank) / 1000.0));
  CHECK(f.recoveries[0].connect_ms == doctest::Approx(1.0));
  CHECK(f.recoveries[0].prepare_ms == doctest::Approx((200 + top_rank) / 1000.0));
  CHECK(f.recoveries[0].views_ms == doctest::Approx(0.5));
  CHECK(f.recoveries[0].form_ms >= 0);
}

TEST_CASE("reconfiguration protocol: another node lost while a slow node still forms the new epoch") {
  // Node 0 dies in step 1; node 1 never finishes forming epoch 2; node 4 (the other pipeline)
  // dies while epoch 2 forms. Epoch 3 is planned from epoch 1 without 0 and 4; node 1, which
  // never answered epoch 2, forms epoch 3 and trains.
  constexpr std::uint64_t steps = 3;
  fixture f({.steps = steps});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {1, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  f.kill(0);
  f.sched.run();
  REQUIRE(f.status().state == "forming");
  f.kill(4);
  f.sched.run();
  const auto both = f.lose(f.initial(), {0, 4});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  INFO(describe(f.events));
  CHECK(f.happened(reconfigured({0, 4}, {}, rules_of(both))));
  CHECK(!f.happened({.kind = event_kind::epoch_formed, .epoch = 2}));
  CHECK(f.happened(finished(3)));
  f.check_steps(steps);
  f.check_pipelines(1, fixture::after(both));
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  CHECK(!f.stages.at(1)->steps.empty());  // the slow node trains in epoch 3
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].lost == node_ids({0, 4}));
}

TEST_CASE("reconfiguration protocol: a node that registers while a reconfiguration forms enters at the next step boundary") {
  // Node 0 dies in step 1; while epoch 2 (planned without it) forms, a seventh worker registers:
  // it enters at the next step boundary. Epoch 2 forms and step 1 commits: at that boundary the
  // new node must be admitted. (Was a bug: forming an epoch cleared every joining node, so a node
  // that registered while an epoch formed was never admitted and idled to the end.)
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  f.kill(0);
  // Run until the coordinator has sent epoch 2's assignments, then start the new worker: its
  // registration arrives before every node of epoch 2 is ready.
  while (!f.happened(reconfigured({0}))) REQUIRE(f.sched.try_run_once());
  f.add_worker(fixture::nodes);
  f.sched.run();
  INFO(describe(f.events));
  const auto joined = f.position({.kind = event_kind::node_joined, .node = 6, .detail = "w6"});
  REQUIRE(joined < f.events.size());
  CHECK(f.position(reconfigured({0})) < joined);
  CHECK(joined < f.position({.kind = event_kind::epoch_formed, .epoch = 2}));  // registered while epoch 2 formed
  // It was not in epoch 2 (planned before it registered), and entered by the next reconfiguration.
  CHECK(f.stages.at(6)->assignments.count(2) == 0);
  const auto first = f.lose(f.initial(), {0});
  const auto admit = f.lose(fixture::after(first), {}, {6});
  REQUIRE(admit.action == planning::reconfiguration_action::continue_training);
  // Admitted at the boundary after step 1 committed (in epoch 2), before step 2 ran.
  const auto admitted = f.position({.kind = event_kind::epoch_forming, .epoch = 3, .step = 2, .detail = rules_of(admit),
                                    .lost = {{}}, .joined = {{6}}});
  REQUIRE(admitted < f.events.size());
  CHECK(f.position({.kind = event_kind::step_committed, .epoch = 2, .step = 1}) < admitted);
  CHECK(f.happened(finished(4)));
  f.check_steps(steps);
  f.check_pipelines(2, fixture::after(admit));
}

namespace {

/// The links of the epoch the fixture's coordinator planned for `e` (every node's assignment of
/// it), as the assignments carry them: read back from the stages each rank runs.
std::vector<messages::p2p_link> links_of(const fixture& f, std::uint64_t e) {
  std::vector<planning::pipeline_instance> pipelines;
  std::map<std::int32_t, std::map<std::int32_t, std::int32_t>> by_pipeline;  // pipeline -> stage -> rank
  for (const auto& [id, rec] : f.stages)
    if (rec->assignments.count(e))
      for (const auto& s : rec->assignments.at(e).stages) by_pipeline[s.pipeline][s.stage] = rec->assignments.at(e).rank.value;
  std::set<std::pair<int, int>> links;
  for (const auto& [p, stages] : by_pipeline) {
    std::vector<int> ranks;
    for (const auto& [stage, r] : stages)
      if (ranks.empty() || ranks.back() != r) ranks.push_back(r);
    for (std::size_t i = 1; i < ranks.size(); ++i) links.insert({ranks[i - 1], ranks[i]}), links.insert({ranks[i], ranks[i - 1]});
    if (ranks.size() > 2) links.insert({ranks.front(), ranks.back()}), links.insert({ranks.back(), ranks.front()});
  }
  for (const auto& [id, rec] : f.stages)
    if (rec->assignments.count(e))
      for (const auto& c : rec->assignments.at(e).copies) links.insert({c.source.value, c.target.value});
  std::vector<messages::p2p_link> out;
  for (auto [from, to] : links) out.push_back({planning::rank{from}, planning::rank{to}});
  return out;
}

}  // namespace

TEST_CASE("reconfiguration protocol: with an NCCL data plane every epoch's assignments carry one fresh id and all its links") {
  // ncclGetUniqueId stands in: 128 bytes, a different fill for every draw.
  int drawn = 0;
  fixture f({.steps = 4, .new_nccl_id = [&] { return std::vector<std::uint8_t>(128, static_cast<std::uint8_t>(++drawn)); }});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  REQUIRE(f.records.size() == 1);
  f.kill(0);
  f.sched.run();
  CHECK(f.happened(finished(4)));
  f.check_steps(4);
  CHECK(drawn == 2);
  for (std::uint64_t e : {1u, 2u}) {
    CAPTURE(e);
    const auto links = links_of(f, e);
    CHECK(!links.empty());
    for (const auto& [id, rec] : f.stages) {
      if (!rec->assignments.count(e)) continue;
      CAPTURE(id);
      const auto& a = rec->assignments.at(e);
      CHECK(a.nccl_id == std::vector<std::uint8_t>(128, static_cast<std::uint8_t>(e)));
      CHECK(a.p2p_links == links);
    }
  }
  CHECK(!f.copies_of(2).empty());  // epoch 2's links include its copies' (links_of reads them)
}

TEST_CASE("reconfiguration protocol: the host transport's assignments carry no NCCL id, and an id that cannot be drawn stops the job") {
  {
    fixture f({.steps = 2});
    f.start();
    CHECK(f.happened(finished(2)));
    for (const auto& [id, rec] : f.stages) {
      CHECK(rec->assignment().nccl_id.empty());
      CHECK(rec->assignment().p2p_links.empty());
    }
  }
  fixture f({.steps = 2, .new_nccl_id = []() -> std::vector<std::uint8_t> { throw std::runtime_error("ncclGetUniqueId failed"); }});
  f.start();
  const auto& stop = f.stop();
  CHECK(stop.outcome == stop_outcome::failed);
  CHECK(stop.detail.find("cannot draw the epoch's NCCL id: ncclGetUniqueId failed") != std::string::npos);
  for (const auto& [id, rec] : f.stages) CHECK(rec->epochs().empty());
}
