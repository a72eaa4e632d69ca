// Checkpoints in the reconfiguration protocol (fixture: protocol_fixture.hpp): when the
// policy says checkpoint and stop, the survivors write each layer once (or the stop says why no
// checkpoint could be written); periodic checkpoints between steps, and one abandoned by a loss.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using oobleck::messages::stop_outcome;
using oobleck::messages::checkpoint_layer_file;
namespace planning = oobleck::planning;

namespace {

/// Every layer of the fixture's model exactly once among `files`.
void check_every_layer_once(const std::vector<checkpoint_layer_file>& files, int layers) {
  std::vector<int> seen;
  for (const auto& f : files) seen.push_back(f.layer.value);
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) all[static_cast<std::size_t>(l)] = l;
  CHECK(seen == all);
}

}  // namespace

TEST_CASE("reconfiguration protocol: a whole pipeline lost: the survivors write each layer once, then the job stops") {
  fixture f({.steps = 6, .checkpoints = true});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }}});
  REQUIRE(f.records.size() == 2);
  const auto stop = f.lose(f.initial(), {0, 1, 2});
  REQUIRE(stop.action == planning::reconfiguration_action::checkpoint_and_stop);
  f.kill(0);
  f.kill(1);
  f.kill(2);
  f.sched.run();
  INFO(describe(f.events));
  // The policy's answer to the losses was checkpoint and stop: no new epoch formed, a checkpoint, the
  // stop.
  CHECK(count(f.events, {.kind = event_kind::epoch_formed}) == 1);  // the first plan's only
  CHECK(f.position({.kind = event_kind::checkpoint_written, .step = 2, .detail = "/ckpt/step-2"}) <
        f.position({.kind = event_kind::stopped, .outcome = stop_outcome::checkpoint_and_stop, .committed = 2}));
  REQUIRE(f.finished.size() == 1);
  CHECK(f.finished[0].first == 2);  // steps 0 and 1 committed: the next is 2
  const int layers = static_cast<int>(f.profile.layers.size());
  check_every_layer_once(f.finished[0].second, layers);
  // Asked of the survivors only, each layer of one of them, spread over all three.
  std::size_t asked = 0;
  for (std::int64_t n : {3, 4, 5}) {
    const auto& rec = *f.stages.at(n);
    REQUIRE(rec.writes.size() <= 1);
    if (rec.writes.empty()) continue;
    CHECK(rec.writes[0].step == 2);
    CHECK(rec.writes[0].dir == "/ckpt/.tmp-2");
    asked += rec.writes[0].layers.size();
    // Only layers of its own stage in the configuration that formed.
    const auto& s = rec.assignments.at(1).stages.at(0);
    for (auto l : rec.writes[0].layers) CHECK((l >= s.first_layer && l < s.end_layer));
  }
  CHECK(asked == static_cast<std::size_t>(layers));
  REQUIRE(f.stops.size() == 1);
  CHECK(f.stops[0].dir == std::optional<std::string>("/ckpt/step-2"));
  CHECK(f.stops[0].step == 2);
  CHECK(f.stops[0].reason.find("cannot continue after losing node(s)") != std::string::npos);
  CHECK(f.stop().outcome == stop_outcome::checkpoint_and_stop);
  // What the user is told on purpose: how to resume from it.
  CHECK(f.told("resume with: --resume /ckpt/step-2"));
  CHECK(f.records.size() == 2);  // nothing more committed
}

TEST_CASE("reconfiguration protocol: a holder without its layer and no other survivor: no checkpoint, the stop says so") {
  fixture f({.steps = 6, .checkpoints = true});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }},
           {3, [](fake_stage_record& r) { r.not_held = {0, 1, 2, 3, 4, 5, 6, 7}; }}});
  REQUIRE(f.records.size() == 2);
  f.kill(0);
  f.kill(1);
  f.kill(2);
  f.sched.run();
  CHECK(f.finished.empty());
  CHECK(f.discarded == std::vector<std::string>{"/ckpt/.tmp-2"});
  REQUIRE(f.stops.size() == 1);
  CHECK(!f.stops[0].dir);
  CHECK(!f.stops[0].latest);  // and there is no earlier one to resume from
  INFO(describe(f.events));
  CHECK(!f.happened({.kind = event_kind::checkpoint_written}));
  CHECK(f.stop().outcome == stop_outcome::checkpoint_and_stop);
  // What the user is told on purpose: why no checkpoint was written, and that nothing is left.
  CHECK(f.told("no checkpoint could be written: layer(s) "));
  CHECK(f.told("there is no earlier checkpoint either"));
}

TEST_CASE("reconfiguration protocol: periodic checkpoints between steps, each layer once, training waits for them") {
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps, .checkpoint_every = 2});
  f.start();
  f.check_steps(steps);
  REQUIRE(f.finished.size() == 2);
  CHECK(f.finished[0].first == 2);
  CHECK(f.finished[1].first == 4);
  const int layers = static_cast<int>(f.profile.layers.size());
  for (const auto& [step, files] : f.finished) check_every_layer_once(files, layers);
  // Each writer wrote after the commit of step 1 and before step 2 ran.
  for (const auto& [id, rec] : f.stages)
    if (rec->traced("write 2")) {
      CHECK(rec->position("commit 1 1") < rec->position("write 2"));
      if (rec->traced("step 1 2")) CHECK(rec->position("write 2") < rec->position("step 1 2"));
    }
  CHECK(f.stops.empty());
  INFO(describe(f.events));
  // Published as each completed, after its step's commit and before the next step's.
  const auto second = f.position({.kind = event_kind::checkpoint_written, .step = 2, .detail = "/ckpt/step-2"});
  CHECK(f.position({.kind = event_kind::step_committed, .step = 1}) < second);
  CHECK(second < f.position({.kind = event_kind::step_committed, .step = 2}));
  CHECK(f.position({.kind = event_kind::checkpoint_written, .step = 4, .detail = "/ckpt/step-4"}) < f.events.size());
  CHECK(f.happened(finished(4)));
}

TEST_CASE("reconfiguration protocol: a node lost while a periodic checkpoint is written: abandoned, training recovers") {
  constexpr std::uint64_t steps = 4;
  fixture f({.steps = steps, .checkpoint_every = 2});
  f.start({{0, [](fake_stage_record& r) { r.hold_write = true; }}});
  REQUIRE(f.records.size() == 2);
  REQUIRE(f.stages.at(0)->traced("write 2"));
  f.kill(0);
  f.sched.run();
  INFO(describe(f.events));
  // Abandoned: its directory discarded, never published as written; training recovered.
  CHECK(f.discarded == std::vector<std::string>{"/ckpt/.tmp-2"});
  CHECK(!f.happened({.kind = event_kind::checkpoint_written, .step = 2}));
  CHECK(f.happened(reconfigured({0})));
  CHECK(f.happened(finished(4)));
  f.check_steps(steps);
  REQUIRE(f.finished.size() == 1);  // step 4's
  CHECK(f.finished[0].first == 4);
}

namespace {

using oobleck::messages::shutdown_atom_v;

/// The layers of node `node`'s stage in the first epoch.
std::vector<int> layers_of(const fixture& f, std::int64_t node) {
  const auto& s = f.stages.at(node)->assignments.at(1).stages.at(0);
  std::vector<int> out;
  for (int l = s.first_layer.value; l < s.end_layer.value; ++l) out.push_back(l);
  return out;
}

std::string layer_list(const std::vector<int>& layers) {
  std::string out;
  for (int l : layers) out += (out.empty() ? "" : ", ") + std::to_string(l);
  return out;
}

/// The layers asked of `node` in its checkpoint writes, in order.
std::vector<int> asked_of(const fixture& f, std::int64_t node) {
  std::vector<int> out;
  for (const auto& w : f.stages.at(node)->writes)
    for (auto l : w.layers) out.push_back(l.value);
  return out;
}

/// The operator's `oobleck-ctl shutdown --checkpoint`, while step 2 runs (node 0 holds it).
void shutdown_with_checkpoint(fixture& f) {
  std::string reply;
  REQUIRE(f.ask(reply, shutdown_atom_v, std::string("requested by the test"), true, f.operator_proof()) == "ok");
  f.sched.run();
}

bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

TEST_CASE("reconfiguration protocol: a writer answers with an error: another holder writes its layers") {
  fixture f({.steps = 6, .checkpoints = true});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }},
           {3, [](fake_stage_record& r) { r.write_error = "injected: no space left on device"; }}});
  REQUIRE(f.records.size() == 2);
  shutdown_with_checkpoint(f);
  INFO(describe(f.events));
  // Node 3 (stage 0 of the second pipeline) was asked for some of its layers and failed; node 0,
  // the other holder of those layers, wrote them; the checkpoint is complete.
  const auto failed = asked_of(f, 3);
  REQUIRE(!failed.empty());
  const auto by_zero = asked_of(f, 0);
  for (int l : failed) CHECK(has(by_zero, l));
  REQUIRE(f.finished.size() == 1);
  CHECK(f.finished[0].first == 2);
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  CHECK(f.told("node 3 failed (injected: no space left on device) writing layer(s)"));
  // The job stopped as the operator asked, its stop naming the checkpoint.
  CHECK(f.stop().outcome == stop_outcome::shutdown);
  CHECK(f.stop().detail.find("checkpoint of step 2 written to /ckpt/step-2") != std::string::npos);
  CHECK(f.told("resume with: --resume /ckpt/step-2"));
  CHECK(f.stops.empty());  // on_stop is the policy's checkpoint-and-stop only
}

TEST_CASE("reconfiguration protocol: a writer that never answers misses its deadline: another holder writes its layers") {
  fixture f({.steps = 6, .checkpoints = true});
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }},
           {3, [](fake_stage_record& r) { r.hold_write = true; }}});
  REQUIRE(f.records.size() == 2);
  shutdown_with_checkpoint(f);
  const auto held = asked_of(f, 3);
  REQUIRE(!held.empty());
  // Waiting for node 3: the coordinator still answers (the checkpoint is its phase).
  CHECK(f.finished.empty());
  CHECK(f.status().state == "checkpointing");
  // Its deadline (30 s at least: deps.checkpoint.write_floor) passes.
  int seconds = 0;
  while (f.finished.empty() && seconds < 600) {
    f.sched.advance_time(std::chrono::seconds(1));
    f.sched.run();
    ++seconds;
  }
  INFO(describe(f.events));
  CHECK(seconds > 30);
  REQUIRE(f.finished.size() == 1);
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  const auto by_zero = asked_of(f, 0);
  for (int l : held) CHECK(has(by_zero, l));
  CHECK(f.told("node 3 did not answer within its deadline writing layer(s) " + layer_list(held)));
  CHECK(f.stop().outcome == stop_outcome::shutdown);
}

TEST_CASE("reconfiguration protocol: every holder of some layers fails to write: no checkpoint, the stop names the layers") {
  fixture f({.steps = 6, .checkpoints = true});
  const auto broken = [](fake_stage_record& r) { r.write_error = "injected: read-only filesystem"; };
  f.start({{0,
            [broken](fake_stage_record& r) {
              r.hold_step = std::pair{1u, 2u};
              broken(r);
            }},
           {3, broken}});
  REQUIRE(f.records.size() == 2);
  const auto layers = layers_of(f, 0);
  REQUIRE(layers == layers_of(f, 3));  // stage 0 of both pipelines
  shutdown_with_checkpoint(f);
  INFO(describe(f.events));
  CHECK(f.finished.empty());
  CHECK(f.discarded == std::vector<std::string>{"/ckpt/.tmp-2"});
  CHECK(!f.happened({.kind = event_kind::checkpoint_written}));
  CHECK(f.stop().outcome == stop_outcome::shutdown);
  const std::string why = "layer(s) " + layer_list(layers) + " have no live holder left that could write them";
  CHECK(f.stop().detail.find("no checkpoint written: " + why) != std::string::npos);
  CHECK(f.told("no checkpoint could be written: " + why));
}

TEST_CASE("reconfiguration protocol: a job that fails writes a checkpoint first when every layer has a holder") {
  fixture f({.steps = 6, .checkpoints = true});
  f.start({{1, [](fake_stage_record& r) { r.fail_step = 2; }}});
  INFO(describe(f.events));
  CHECK(f.records.size() == 2);  // steps 0 and 1; step 2 fails every time
  REQUIRE(f.finished.size() == 1);
  CHECK(f.finished[0].first == 2);
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  CHECK(f.position({.kind = event_kind::checkpoint_written, .step = 2, .detail = "/ckpt/step-2"}) <
        f.position({.kind = event_kind::stopped, .outcome = stop_outcome::failed}));
  CHECK(f.stop().detail.find("failures in a row without a lost node") != std::string::npos);
  CHECK(f.stop().detail.find("checkpoint of step 2 written to /ckpt/step-2") != std::string::npos);
  CHECK(f.told("resume with: --resume /ckpt/step-2"));
}

TEST_CASE("reconfiguration protocol: a shutdown with a checkpoint during a periodic one stops after that one") {
  fixture f({.steps = 6, .checkpoint_every = 2});
  f.start({{0, [](fake_stage_record& r) { r.hold_write = true; }}});
  REQUIRE(f.records.size() == 2);
  REQUIRE(f.stages.at(0)->traced("write 2"));  // the periodic checkpoint of step 2 waits for node 0
  shutdown_with_checkpoint(f);
  CHECK(f.finished.empty());
  CHECK(f.told("stopping after the checkpoint of step 2 being written"));
  for (int seconds = 0; f.finished.empty() && seconds < 600; ++seconds) {
    f.sched.advance_time(std::chrono::seconds(1));
    f.sched.run();
  }
  INFO(describe(f.events));
  // One checkpoint (the periodic one, completed by node 0's other holders), then the stop; no
  // step ran after the commit of step 1.
  REQUIRE(f.finished.size() == 1);
  CHECK(f.finished[0].first == 2);
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  CHECK(f.records.size() == 2);
  CHECK(f.stop().outcome == stop_outcome::shutdown);
  CHECK(f.stop().detail.find("checkpoint of step 2 written to /ckpt/step-2") != std::string::npos);
}

TEST_CASE("reconfiguration protocol: a loss during a commit that leaves too few nodes: the commit stands once, the checkpoint is of the step after it") {
  // Four nodes, two pipelines of two: node 0 dies while applying the commit of step 1, and the
  // three left are fewer than (f + 1) * n0 = 4, so the policy says checkpoint and stop. The
  // commit stood when the loss was handled; the stop that follows must not count it again (it
  // once did: a second record "step 2" with step 1's loss, and a checkpoint named step 3 holding
  // the state after step 1).
  fixture f({.nodes = 4, .steps = 6, .checkpoints = true});
  REQUIRE(f.plan.pipelines.size() == 2u);
  f.kill_during_commit(0, {1, 1});
  INFO(describe(f.events));
  CHECK(count(f.events, {.kind = event_kind::commit_stood}) == 1);
  CHECK(count(f.events, {.kind = event_kind::step_committed, .step = 1}) == 1);
  CHECK(!f.happened({.kind = event_kind::step_committed, .step = 2}));
  REQUIRE(f.records.size() == 2u);
  CHECK(f.records[0].step == 0u);
  CHECK(f.records[1].step == 1u);
  REQUIRE(f.finished.size() == 1u);
  CHECK(f.finished[0].first == 2u);  // steps 0 and 1 committed: the next is 2
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  REQUIRE(f.stops.size() == 1u);
  CHECK(f.stops[0].step == 2u);
  CHECK(f.stop().outcome == stop_outcome::checkpoint_and_stop);
}

TEST_CASE("reconfiguration protocol: a writer of a periodic checkpoint lost, too few left: a fresh checkpoint, then the stop") {
  // Four nodes, a periodic checkpoint before step 2: node 0, one of its writers, dies while
  // writing, and the three left are too few. The periodic checkpoint is abandoned (its directory
  // discarded); the stop writes one of its own from the survivors, who hold every layer. It once
  // took over the abandoned one and waited for the dead writer (a hang here, a deadline and a
  // checkpoint into a discarded directory on a real cluster).
  fixture f({.nodes = 4, .steps = 6, .checkpoint_every = 2});
  f.start({{0, [](fake_stage_record& r) { r.hold_write = true; }}});
  REQUIRE(f.records.size() == 2u);
  REQUIRE(f.stages.at(0)->traced("write 2"));
  f.kill(0);
  f.sched.run();
  INFO(describe(f.events));
  REQUIRE(f.discarded.size() == 1u);
  REQUIRE(f.finished.size() == 1u);
  CHECK(f.finished[0].first == 2u);
  check_every_layer_once(f.finished[0].second, static_cast<int>(f.profile.layers.size()));
  CHECK(f.stages.at(0)->writes.size() == 1u);  // the dead writer was not asked again
  REQUIRE(f.stops.size() == 1u);
  CHECK(f.stops[0].step == 2u);
  CHECK(f.stops[0].dir.has_value());
  CHECK(f.stop().outcome == stop_outcome::checkpoint_and_stop);
  CHECK(f.records.size() == 2u);
}
