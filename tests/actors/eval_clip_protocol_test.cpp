// Issue 24 on the deterministic scheduler (fixture: protocol_fixture.hpp): evaluation rounds between
// steps (when, over which windows, what a failure during one does), the clipping factor a commit
// carries, and the check that a tied embedding's two copies stayed equal.

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <vector>

#include "actors/protocol_fixture.hpp"
#include "planning/makespan.hpp"
#include "runtime/optimizer_options.hpp"

using namespace oobleck::messages;
using namespace oobleck::testing;

namespace {

/// The evaluation orders the node's stages received, by step.
std::vector<stage_step> evals_seen(const fake_stage_record& rec) {
  std::vector<stage_step> out;
  for (const auto& s : rec.steps)
    if (s.eval) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("evaluation: every K committed steps a round over the first W windows, split across the pipelines") {
  auto o = fixture::roomy(4, 5);
  o.eval_every = 2;
  o.eval_windows = 6;
  fixture f(o);
  f.start();
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.happened(finished(5)));
  f.check_steps(5);
  // After steps 1 and 3 (2 and 4 committed); not after step 4 (5 committed).
  REQUIRE(f.evals.size() == 2);
  CHECK(f.evals[0].step == 1);
  CHECK(f.evals[1].step == 3);
  for (const auto& e : f.evals) {
    CHECK(e.windows == 6);
    CHECK(e.loss == doctest::Approx(3.0));
  }
  // Each round's windows tile [0, 6) once, across the pipelines' first stages; the round runs
  // between the two steps, on every stage of every pipeline.
  std::map<std::uint64_t, std::map<std::int32_t, std::int32_t>> ranges;  // step -> first -> count
  int stages_evaluating = 0;
  for (const auto& [id, rec] : f.stages) {
    const auto seen = evals_seen(*rec);
    if (seen.empty()) continue;
    ++stages_evaluating;
    CHECK(seen.size() == 2);
    for (const auto& s : seen)
      if (rec->assignment().stages.front().stage == 0) ranges[s.step][s.first_microbatch] = s.microbatches;
    // The round of step 2 comes after step 1's commit and before step 2 runs.
    CHECK(rec->position("commit 1 1") < rec->position("step 1 2"));
    std::size_t eval_at = 0, step2_at = 0;
    for (std::size_t i = 0; i < rec->steps.size(); ++i) {
      if (rec->steps[i].step == 2 && rec->steps[i].eval) eval_at = i;
      if (rec->steps[i].step == 2 && !rec->steps[i].eval) step2_at = i;
    }
    CHECK(eval_at < step2_at);
  }
  CHECK(stages_evaluating >= 2);
  REQUIRE(ranges.size() == 2);
  for (const auto& [step, tiles] : ranges) {
    std::int32_t next = 0;
    for (auto [first, count] : tiles) {
      CHECK(first == next);
      next += count;
    }
    CHECK(next == 6);
  }
}

TEST_CASE("evaluation: the round that ends the job runs before it stops, none without [eval]") {
  auto o = fixture::roomy(2, 4);
  o.eval_every = 2;
  o.eval_windows = 3;
  fixture f(o);
  f.start();
  f.sched.run();
  CHECK(f.happened(finished(4)));
  REQUIRE(f.evals.size() == 2);
  CHECK(f.evals.back().step == 3);

  fixture plain(fixture::roomy(2, 4));
  plain.start();
  plain.sched.run();
  CHECK(plain.happened(finished(4)));
  CHECK(plain.evals.empty());
  for (const auto& [id, rec] : plain.stages) CHECK(evals_seen(*rec).empty());
}

TEST_CASE("evaluation: a failure during a round is handled like one during a step: formed again, the round again") {
  auto o = fixture::roomy(4, 4);
  o.eval_every = 2;
  o.eval_windows = 4;
  fixture f(o);
  f.start({{0, [](fake_stage_record& r) { r.fail_evals = 1; }}});
  f.sched.run();
  INFO(describe(f.events));
  CHECK(f.happened(finished(4)));
  f.check_steps(4);
  // Two rounds recorded (after steps 1 and 3), the first after a second epoch formed.
  REQUIRE(f.evals.size() == 2);
  CHECK(f.evals[0].step == 1);
  CHECK(f.evals[0].epoch == 2);
  CHECK(f.evals[0].loss == doctest::Approx(3.0));
  CHECK(f.happened({.kind = event_kind::epoch_forming, .epoch = 2}));
  // Every stage evaluated before step 2 twice (the failed round, then the one in epoch 2) and
  // ran step 2 once, after the round that succeeded.
  for (const auto& [id, rec] : f.stages) {
    std::vector<std::uint64_t> epochs_of_rounds;
    int step2 = 0;
    for (const auto& s : rec->steps) {
      if (s.step == 2 && s.eval) epochs_of_rounds.push_back(s.epoch);
      if (s.step == 2 && !s.eval) {
        ++step2;
        CHECK(s.epoch == 2);
      }
    }
    CHECK(epochs_of_rounds == std::vector<std::uint64_t>{1, 2});
    CHECK(step2 == 1);
  }
}

TEST_CASE("clipping: the commit carries pipeline 0's factor to every node, without clip_norm it is 1") {
  for (const double clip : {0.0, 1.0, 100.0}) {
    CAPTURE(clip);
    auto o = fixture::roomy(4, 2);
    o.clip_norm = clip;
    fixture f(o);
    f.start();
    f.sched.run();
    CHECK(f.happened(finished(2)));
    REQUIRE(f.records.size() == 2);
    // Pipeline 0's stages report 1 + stage each.
    double sq = 0;
    const auto stages = f.records[0].pipelines.at(0).nodes.size();
    for (std::size_t s = 0; s < stages; ++s) sq += 1.0 + static_cast<double>(s);
    const double expected = clip > 0 ? oobleck::runtime::clip_scale(clip, std::sqrt(sq)) : 1.0;
    if (clip == 1.0) CHECK(expected < 1.0);
    if (clip == 100.0) CHECK(expected == 1.0);
    for (const auto& r : f.records) {
      CHECK(r.grad_scale == doctest::Approx(expected));
      CHECK(r.grad_norm == doctest::Approx(clip > 0 ? std::sqrt(sq) : 0.0));
    }
    int committing = 0;
    for (const auto& [id, rec] : f.stages)
      for (const auto& c : rec->commits) {
        ++committing;
        CHECK(c.grad_scale.value == doctest::Approx(expected));
      }
    CHECK(committing >= 4);
  }
}

TEST_CASE("tied embedding: copies that disagree after a commit are reported, equal ones are not") {
  for (const bool bad : {false, true}) {
    CAPTURE(bad);
    fixture f(fixture::roomy(4, 2));
    fixture::setup_map setup;
    for (std::int64_t n = 0; n < 4; ++n) setup[n] = [bad](fake_stage_record& r) { r.bad_tied_digest = bad; };
    f.start(setup);
    f.sched.run();
    CHECK(f.happened(finished(2)));
    REQUIRE(f.records.size() == 2);
    CHECK(f.records[0].tied_digests.size() >= 2);
    CHECK(f.told("copies of the tied embedding") == bad);
  }
}

TEST_CASE("status: each pipeline names its stages' layers (first layer of each stage, then the end)") {
  fixture f(fixture::roomy(4, 2));
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair<std::uint64_t, std::uint64_t>{1, 1}; }}});
  f.sched.run();  // training, step 1 held
  const auto s = f.status();
  REQUIRE(!s.pipelines.empty());
  for (const auto& p : s.pipelines) {
    CAPTURE(p.nodes.size());
    REQUIRE(p.stage_layers.size() >= 2);
    CHECK(p.stage_layers.front() == 0);
    CHECK(p.stage_layers.back() == 6);
    for (std::size_t i = 1; i < p.stage_layers.size(); ++i) CHECK(p.stage_layers[i - 1] < p.stage_layers[i]);
  }
}

TEST_CASE("ideal_ms: the slowest pipeline's 1F1B makespan from its stages' own op times") {
  fixture f(fixture::roomy(4, 2));
  f.start();
  f.sched.run();
  CHECK(f.happened(finished(2)));
  REQUIRE(f.records.size() == 2);
  for (const auto& r : f.records) {
    // Forward 1 ms, backward 2 ms on every stage (the fakes'); no all-reduce wait, no AdamW time.
    double expected = 0;
    for (const auto& [nodes, stage_layers, microbatches] : r.pipelines) {
      const std::vector<double> fw(nodes.size(), 1.0), bw(nodes.size(), 2.0);
      expected = std::max(expected, oobleck::planning::pipeline_time::one_f_one_b(fw, bw).at(microbatches));
    }
    CHECK(expected > 0);
    CHECK(r.ideal_ms == doctest::Approx(expected));
  }
}

TEST_CASE("predicted_ms: every step carries its epoch's predicted step: the first plan's, then the reconfiguration's") {
  // Node 2 dies while applying the commit of step 1; epoch 2 runs on the five survivors.
  fixture f({.steps = 4});
  f.kill_during_commit(2, {1, 1});
  const auto r = f.lose(f.initial(), {2});
  INFO(describe(f.events));
  CHECK(f.happened(finished(4)));
  REQUIRE(r.step_ms > 0);
  CHECK(r.step_ms != doctest::Approx(f.plan.step_ms));  // five nodes plan another step than six
  int first = 0, second = 0;
  for (const auto& rec : f.records) {
    CAPTURE(rec.step);
    CAPTURE(rec.epoch);
    if (rec.epoch == 1) {
      ++first;
      CHECK(rec.predicted_ms == doctest::Approx(f.plan.step_ms));
    } else {
      ++second;
      CHECK(rec.predicted_ms == doctest::Approx(r.step_ms));
    }
  }
  CHECK(first >= 1);
  CHECK(second >= 1);
}
