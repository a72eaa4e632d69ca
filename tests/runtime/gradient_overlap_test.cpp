// The gradient all-reduce overlapped with the backward (executor_options::overlap_gradient_reduce):
// the same sums, bit for bit, as the all-reduce after the schedule; it runs without anyone
// waiting for it; and an abort while it is in flight fails the step instead of hanging it.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "support/deadline.hpp"
#include "support/fake_communicator.hpp"
#include "runtime/stage_executor.hpp"

using namespace oobleck;
using namespace std::chrono_literals;
using testing::fake_hub;

namespace {

runtime::gpt_config tiny() { return {.vocab = 64, .d_model = 8, .heads = 2, .blocks = 2, .seq_len = 4, .seed = 3}; }

// Two heterogeneous pipelines over the 4 layers of `tiny`: A = ranks 0, 1 cut at layer 2;
// B = ranks 2, 3 cut at layer 1. Every layer has two holders, in different pipelines.
const std::vector<runtime::stage_position> positions{
    {0, 2, 0, 2, -1, 1}, {2, 4, 1, 2, 0, -1}, {0, 1, 0, 2, -1, 3}, {1, 4, 1, 2, 2, -1}};
const std::vector<std::vector<int>> groups{{0, 2}, {0, 3}, {1, 3}, {1, 3}};
constexpr int microbatches_per_pipeline = 3;

struct two_pipelines {
  fake_hub hub{4};
  std::vector<std::unique_ptr<runtime::layer_store>> stores;
  std::vector<std::unique_ptr<runtime::stage_executor>> stages;
  torch::Tensor inputs[2], targets[2];

  explicit two_pipelines(bool overlap) {
    runtime::executor_options options{.microbatch_size = 2, .global_microbatches = 2 * microbatches_per_pipeline};
    options.overlap_gradient_reduce = overlap;
    for (const auto& pos : positions) {
      stores.push_back(std::make_unique<runtime::layer_store>(tiny()));
      stores.back()->ensure(pos.first_layer, pos.end_layer);
      const int rank = static_cast<int>(stages.size());
      stages.push_back(std::make_unique<runtime::stage_executor>(*stores.back(), pos, hub.at(rank), options));
    }
    torch::manual_seed(5);
    for (int p = 0; p < 2; ++p) {
      inputs[p] = torch::randint(0, 64, {2 * microbatches_per_pipeline, 4}, torch::kInt64);
      targets[p] = torch::randint(0, 64, {2 * microbatches_per_pipeline, 4}, torch::kInt64);
    }
  }
  /// Runs `body(rank, executor)` on a thread per rank; what each threw ("" if nothing).
  std::vector<std::future<std::string>> start(std::function<void(int, runtime::stage_executor&)> body) {
    std::vector<std::future<std::string>> done;
    for (int r = 0; r < 4; ++r)
      done.push_back(std::async(std::launch::async, [this, r, body] {
        try {
          body(r, *stages[r]);
          return std::string();
        } catch (const runtime::comm_error& e) {
          return std::string("comm_error: ") + e.what();
        }
      }));
    return done;
  }
  double run_step(int r, bool pass_groups) {
    const int p = r / 2;
    return stages[r]->run_step(0, p * microbatches_per_pipeline, microbatches_per_pipeline, inputs[p], targets[p],
                               pass_groups ? groups : std::vector<std::vector<int>>{});
  }
  std::vector<std::string> finish(std::vector<std::future<std::string>>& done) {
    testing::wait_or_fail(done, 20s, "a stage's step", [&] { hub.abort_all(); });
    std::vector<std::string> out;
    for (auto& f : done) out.push_back(f.get());
    return out;
  }
  torch::Tensor gradient(int r, int layer) { return stores[r]->gradients(layer).clone(); }
};

}  // namespace

TEST_CASE("overlapped gradient all-reduce: the same sums, bit for bit, as the all-reduce after the schedule") {
  two_pipelines sequential(false), overlapped(true);
  auto a = sequential.start([&](int r, runtime::stage_executor& e) {
    sequential.run_step(r, false);
    e.reduce_gradients(groups);
  });
  for (const auto& err : sequential.finish(a)) REQUIRE(err.empty());

  // With overlap the all-reduces run on their own: once every schedule has ended they complete
  // without reduce_gradients being called (it then only collects them).
  auto b = overlapped.start([&](int r, runtime::stage_executor&) { overlapped.run_step(r, true); });
  for (const auto& err : overlapped.finish(b)) REQUIRE(err.empty());
  const auto expected = sequential.gradient(0, 0);
  bool reduced_in_background = false;
  for (auto until = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(1ms))
    if (torch::equal(overlapped.gradient(0, 0), expected)) {
      reduced_in_background = true;
      break;
    }
  CHECK(reduced_in_background);
  auto c = overlapped.start([&](int, runtime::stage_executor& e) { e.reduce_gradients(groups); });
  for (const auto& err : overlapped.finish(c)) REQUIRE(err.empty());

  for (int r = 0; r < 4; ++r)
    for (int l = positions[r].first_layer; l < positions[r].end_layer; ++l) {
      CAPTURE(r);
      CAPTURE(l);
      const auto want = sequential.gradient(r, l);
      CHECK(want.abs().sum().item<double>() > 0);
      CHECK(torch::equal(overlapped.gradient(r, l), want));  // bitwise
    }
  // Both holders of a layer agree, bit for bit.
  for (int l = 0; l < 4; ++l)
    CHECK(torch::equal(overlapped.gradient(groups[l][0], l), overlapped.gradient(groups[l][1], l)));
  // The timing splits: compute and p2p wait were measured on every stage.
  for (auto& s : overlapped.stages) {
    CHECK(s->last_step_timing().compute_ms > 0);
    CHECK(s->last_step_timing().p2p_wait_ms >= 0);
    CHECK(s->last_step_timing().allreduce_ms >= 0);
  }
}

TEST_CASE("an abort while overlapped all-reduces are in flight fails the step with comm_error, never a hang") {
  two_pipelines run(true);
  run.hub.block(3);  // pipeline B's last stage freezes: A's all-reduces with it cannot finish
  auto done = run.start([&](int r, runtime::stage_executor& e) {
    run.run_step(r, true);
    e.reduce_gradients(groups);
  });
  // Rank 3 blocked, rank 2 waiting for its gradient, and the communication threads of ranks 0
  // and 1 inside all-reduces with rank 3: nothing moves until the abort.
  CHECK_MESSAGE(run.hub.wait_until_parked(4, 20s), "the ranks never all waited");
  run.hub.abort_all();
  const auto r = run.finish(done);
  for (const auto& err : r) CHECK(err.find("comm_error") == 0);
  // The failed step's gradients go at once (nothing of the reducer is left running).
  auto discarded = run.start([&](int, runtime::stage_executor& e) { e.discard(); });
  for (const auto& err : run.finish(discarded)) CHECK(err.empty());
}

TEST_CASE("a step that fails while its all-reduces are in flight cancels them instead of waiting") {
  two_pipelines run(true);
  // Rank 0 finishes its schedule with its all-reduces posted (they wait for rank 3's layer 1 and
  // rank 2's layer 0), then fails in a later operation; discard must not hang on them.
  run.hub.block(3);
  auto done = run.start([&](int r, runtime::stage_executor& e) {
    if (r == 0) {
      run.run_step(r, true);
      e.discard();  // the step failed elsewhere: cancels the in-flight all-reduces
      return;
    }
    run.run_step(r, true);
    e.reduce_gradients(groups);
  });
  // Rank 0's discard aborts its own communicator only; the others are released by the abort of
  // the whole epoch, as the coordinator would do.
  CHECK_MESSAGE(run.hub.wait_until_parked(3, 20s), "the ranks never waited");
  const auto first = done[0].wait_for(20s);
  CHECK(first == std::future_status::ready);
  run.hub.abort_all();
  const auto r = run.finish(done);
  CHECK(r[0].empty());
  for (int k = 1; k < 4; ++k) CHECK(r[k].find("comm_error") == 0);
}
