// Stage executor: the 1F1B op list runs to completion on every stage, and data-plane faults
// surface as errors, never as hangs.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "support/cluster_harness.hpp"

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
  /// Runs every stage on its own thread; returns what each stage threw ("" when it finished).
  /// With abort_on_error, the first failure aborts every rank, as the coordinator does when a stage
  /// reports one.
  std::vector<std::string> run(int microbatches, std::chrono::milliseconds deadline = 20s,
                               fake_hub* abort_on_error = nullptr) {
    std::vector<std::future<std::string>> done;
    for (auto& s : stages)
      done.push_back(std::async(std::launch::async, [&, e = s.get()] {
        try {
          e->run_step(0, 0, microbatches, inputs, targets);
          return std::string();
        } catch (const runtime::comm_error& err) {
          if (abort_on_error) abort_on_error->abort_all();
          return std::string("comm_error: ") + err.what();
        }
      }));
    std::vector<std::string> out;
    for (auto& f : done) {
      REQUIRE_MESSAGE(f.wait_for(deadline) == std::future_status::ready, "a stage hung");
      out.push_back(f.get());
    }
    return out;
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
      for (const auto& r : p.run(m)) CHECK(r.empty());
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
  const auto r = p.run(4, 5s, &hub);
  CHECK(r[1].find("injected failure after 3 ops") != std::string::npos);
  // Its neighbours were waiting on it; the abort releases them with an error too.
  CHECK(r[0].find("comm_error") == 0);
  CHECK(r[2].find("comm_error") == 0);
}

TEST_CASE("a crashed peer fails its neighbours' pending operations") {
  fake_hub hub(3);
  pipeline_run p(hub, 3, 4);
  std::thread crasher([&] {
    std::this_thread::sleep_for(20ms);
    hub.crash(1);
  });
  hub.block(1);  // stage 1 stops making progress, then dies
  const auto r = p.run(4, 5s);
  crasher.join();
  CHECK(r[0].find("comm_error") == 0);
  CHECK(r[2].find("comm_error") == 0);
}

TEST_CASE("a frozen peer or dropped messages hang nobody once the epoch is aborted") {
  for (bool drop : {false, true}) {
    CAPTURE(drop);
    fake_hub hub(2);
    pipeline_run p(hub, 2, 3);
    if (drop) hub.drop_sends_of(0);
    else hub.block(1);
    std::thread watchdog([&] {
      std::this_thread::sleep_for(50ms);
      hub.abort_all();
    });
    const auto start = std::chrono::steady_clock::now();
    const auto r = p.run(3, 5s);
    watchdog.join();
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    CHECK(r[drop ? 1 : 0].find("comm_error") == 0);
    CHECK(r[1].find("comm_error") == 0);
  }
}

TEST_CASE("discard drops a failed step's gradients; commit moves parameters") {
  fake_hub hub(1);
  pipeline_run p(hub, 1, 2);
  const auto before = p.stages[0]->parameter_digest(1);
  p.run(2);
  p.stages[0]->discard();
  CHECK(!p.stages[0]->parameters(1)[0].grad().defined());
  CHECK(p.stages[0]->parameter_digest(1) == before);
  p.run(2);
  p.stages[0]->commit();
  CHECK(p.stages[0]->parameter_digest(1) != before);
  CHECK(p.stages[0]->optimizer_state(1).step == 1);
}
