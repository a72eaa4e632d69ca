// Stage executor: the 1F1B op list runs to completion on every stage, and data-plane faults
// surface as errors, never as hangs.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <chrono>
#include <future>

#include "support/cluster_harness.hpp"
#include "support/deadline.hpp"

using namespace oobleck;
using namespace std::chrono_literals;
using testing::fake_hub;

namespace {

runtime::gpt_config tiny() { return {.vocab = 64, .d_model = 8, .heads = 2, .blocks = 2, .seq_len = 4, .seed = 3}; }

/// S stages over the 4 layers of `tiny`, ranks 0..S-1.
std::vector<runtime::stage_position> split(int stages) {
  static const std::vector<std::vector<std::pair<int, int>>> ranges{
      {{0, 4}}, {{0, 2}, {2, 4}}, {{0, 1}, {1, 3}, {3, 4}}, {{0, 1}, {1, 2}, {2, 3}, {3, 4}}};
  std::vector<runtime::stage_position> out;
  for (int k = 0; k < stages; ++k)
    out.push_back({ranges[stages - 1][k].first, ranges[stages - 1][k].second, k, stages, k - 1, k + 1});
  return out;
}

struct pipeline_run {
  std::vector<std::unique_ptr<runtime::layer_store>> stores;
  std::vector<std::unique_ptr<runtime::stage_executor>> stages;
  torch::Tensor inputs, targets;
  pipeline_run(fake_hub& hub, int num_stages, int microbatches) {
    const runtime::executor_options options{.microbatch_size = 2, .global_microbatches = microbatches};
    for (const auto& pos : split(num_stages)) {
      stores.push_back(std::make_unique<runtime::layer_store>(tiny()));
      stores.back()->ensure(pos.first_layer, pos.end_layer);
      stages.push_back(std::make_unique<runtime::stage_executor>(*stores.back(), pos, hub.at(pos.stage), options));
    }
    inputs = torch::randint(0, 64, {2 * microbatches, 4}, torch::kInt64);
    targets = torch::randint(0, 64, {2 * microbatches, 4}, torch::kInt64);
  }
  /// Starts every stage's step on a thread of its own; each future gives what its stage threw
  /// ("" when it finished). With abort_on_error, the first failure aborts every rank, as the
  /// coordinator does when a stage reports one.
  std::vector<std::future<std::string>> start(int microbatches, fake_hub* abort_on_error = nullptr) {
    std::vector<std::future<std::string>> done;
    for (auto& s : stages)
      done.push_back(std::async(std::launch::async, [this, microbatches, abort_on_error, e = s.get()] {
        try {
          e->run_step(0, 0, microbatches, inputs, targets);
          return std::string();
        } catch (const runtime::comm_error& err) {
          if (abort_on_error) abort_on_error->abort_all();
          return std::string("comm_error: ") + err.what();
        }
      }));
    return done;
  }
  /// What each stage threw. A stage still running after `deadline` fails the test (throws): the
  /// hub is aborted to release it (and the binary exits if even that does not), never a hang.
  static std::vector<std::string> finish(std::vector<std::future<std::string>>& done, fake_hub& hub,
                                         std::chrono::milliseconds deadline = 20s) {
    testing::wait_or_fail(done, deadline, "a stage's step", [&] { hub.abort_all(); });
    std::vector<std::string> out;
    for (auto& f : done) out.push_back(f.get());
    return out;
  }
  std::vector<std::string> run(fake_hub& hub, int microbatches, std::chrono::milliseconds deadline = 20s,
                               fake_hub* abort_on_error = nullptr) {
    auto done = start(microbatches, abort_on_error);
    return finish(done, hub, deadline);
  }
};

}  // namespace

TEST_CASE("every stage finishes its 1F1B ops for S in 1..4 and m in 1..9") {
  torch::manual_seed(1);
  for (int S = 1; S <= 4; ++S)
    for (int m = 1; m <= 9; ++m) {
      CAPTURE(S);
      CAPTURE(m);
      fake_hub hub(S);
      pipeline_run p(hub, S, m);
      for (const auto& r : p.run(hub, m)) CHECK(r.empty());
      // Every parameter of every stage received a gradient.
      for (auto& s : p.stages)
        for (int l = s->position().first_layer; l < s->position().end_layer; ++l)
          for (const auto& t : s->parameters(l)) CHECK(t.grad().abs().sum().item<double>() > 0);
    }
}

TEST_CASE("an injected failure surfaces as comm_error on the failing stage and its peers") {
  fake_hub hub(3);
  pipeline_run p(hub, 3, 4);
  hub.fail_after(1, 3);
  const auto r = p.run(hub, 4, 20s, &hub);
  CHECK(r[1].find("injected failure after 3 ops") != std::string::npos);
  // Its neighbours were waiting on it; the abort releases them with an error too.
  CHECK(r[0].find("comm_error") == 0);
  CHECK(r[2].find("comm_error") == 0);
}

TEST_CASE("a crashed peer fails its neighbours' pending operations") {
  fake_hub hub(3);
  pipeline_run p(hub, 3, 4);
  hub.block(1);  // stage 1 stops making progress, then dies
  auto done = p.start(4);
  // Once all three stages wait (stage 1 blocked, its neighbours on it), nothing moves by itself.
  // (CHECK, not REQUIRE: leaving the test with stages running would block in their futures.)
  CHECK_MESSAGE(hub.wait_until_parked(3, 20s), "the stages never all waited");
  hub.crash(1);
  const auto r = pipeline_run::finish(done, hub);
  CHECK(r[0].find("comm_error") == 0);
  CHECK(r[1].find("crashed") != std::string::npos);
  CHECK(r[2].find("comm_error") == 0);
}

TEST_CASE("a frozen peer or dropped messages hang nobody once the epoch is aborted") {
  for (bool drop : {false, true}) {
    CAPTURE(drop);
    fake_hub hub(2);
    pipeline_run p(hub, 2, 3);
    if (drop) hub.drop_sends_of(0);
    else hub.block(1);
    auto done = p.start(3);
    // Both stages stuck for good: stage 1 frozen (or waiting for lost activations), stage 0
    // waiting for its gradients.
    CHECK_MESSAGE(hub.wait_until_parked(2, 20s), "the stages never both waited");
    hub.abort_all();
    // The abort must release both: finish() fails the test if one is still stuck after 20 s.
    const auto r = pipeline_run::finish(done, hub);
    CHECK(r[0].find("comm_error") == 0);
    CHECK(r[1].find("comm_error") == 0);
  }
}

TEST_CASE("a stage that nobody releases fails the run at its deadline instead of hanging it") {
  // No abort comes from the test: only the deadline's release (aborting the hub) frees the
  // stages. The wait must end, reporting the stuck stages, whatever they do.
  fake_hub hub(2);
  pipeline_run p(hub, 2, 3);
  hub.block(1);
  auto done = p.start(3);
  CHECK(testing::wait_with_deadline(done, 500ms, [&] { hub.abort_all(); }) == testing::wait_outcome::released);
  for (auto& f : done) CHECK(f.get().find("comm_error") == 0);
}

TEST_CASE("discard drops a failed step's gradients, commit moves parameters") {
  fake_hub hub(1);
  pipeline_run p(hub, 1, 2);
  const auto before = p.stages[0]->parameter_digest(1);
  p.run(hub, 2);
  const auto failed = p.stages[0]->parameters(1)[0].grad().clone();
  CHECK(failed.abs().sum().item<double>() > 0);
  p.stages[0]->discard();
  CHECK(p.stages[0]->parameter_digest(1) == before);
  // The buffer is kept, and the next step starts from zero: it holds that step's gradients alone.
  p.run(hub, 2);
  CHECK(torch::equal(p.stages[0]->parameters(1)[0].grad(), failed));
  p.run(hub, 2);
  p.stages[0]->commit();
  CHECK(p.stages[0]->parameter_digest(1) != before);
  CHECK(p.stages[0]->optimizer_state(1).step == 1);
}
