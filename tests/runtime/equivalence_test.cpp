// Pipelines of stage executors must train exactly like plain LibTorch (issue: stage execution).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cmath>

#include <future>

#include "support/cluster_harness.hpp"
#include "support/deadline.hpp"

using namespace oobleck::testing;

namespace {

/// `tolerance` bounds the parameters' relative error after the steps: 1e-5 for oobleck-gpt; GPT-2 is
/// compared within 1e-4 (issue 24) because its attention's key bias has an identically zero
/// gradient (softmax ignores a constant added to every key), so AdamW turns the rounding noise of
/// each summation order into full-size updates of it (~5e-5 relative after 5 steps, whatever the
/// split, one stage included; every other tensor agrees within 1e-6).
void check_equivalent(const training_result& got, const training_result& reference, double tolerance = 1e-5) {
  // fp32 sums in another order (microbatches, pipelines, all-reduce) differ in the last bits and
  // AdamW rescales tiny gradients, so elements differ slightly; tensors agree to 1e-5 relative.
  const double diff = max_relative_difference(got, reference);
  MESSAGE("after " << reference.losses.size() << " steps: max ||p - ref|| / ||ref|| = " << diff
                   << ", max elementwise |p - ref| / max|ref| = " << max_elementwise_difference(got, reference));
  CHECK(diff < tolerance);
  // AdamW hides a uniformly mis-scaled gradient; compare the reduced gradients themselves.
  const double grad_diff = max_relative_difference(got.first_gradients, reference.first_gradients);
  MESSAGE("step 0 gradients: max ||g - ref|| / ||ref|| = " << grad_diff);
  CHECK(grad_diff < 1e-5);
  for (std::size_t k = 0; k < reference.losses.size(); ++k)
    CHECK(got.losses[k] == doctest::Approx(reference.losses[k]).epsilon(1e-5));
  // Every replica of every layer is bitwise identical.
  for (const auto& d : got.digests)
    for (auto x : d) CHECK(x == d.front());
}

}  // namespace

TEST_CASE("the reference itself learns: loss falls over the steps") {
  auto s = small_setup();
  s.steps = 8;
  const auto ref = train_reference(s);
  CHECK(ref.losses.back() < ref.losses.front() - 0.3);
}

TEST_CASE("(a) one stage equals the plain loop") {
  const auto s = small_setup();
  check_equivalent(train_pipelines(s, {{{{0, 6}}, 8}}), train_reference(s));
}

TEST_CASE("(b) 2, 3 and 4 stages on threads equal the plain loop") {
  const auto s = small_setup();
  const auto ref = train_reference(s);
  check_equivalent(train_pipelines(s, {{{{0, 3}, {3, 6}}, 8}}), ref);
  check_equivalent(train_pipelines(s, {{{{0, 1}, {1, 4}, {4, 6}}, 8}}), ref);
  check_equivalent(train_pipelines(s, {{{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, 8}}), ref);
}

TEST_CASE("(c) two heterogeneous pipelines splitting the batch 3:5 equal the plain loop") {
  const auto s = small_setup();
  const auto ref = train_reference(s);
  check_equivalent(train_pipelines(s, {{{{0, 3}, {3, 6}}, 3}, {{{0, 1}, {1, 4}, {4, 6}}, 5}}), ref);
  // Three pipelines of depths 1, 2 and 4, 1:3:4.
  check_equivalent(
      train_pipelines(s, {{{{0, 6}}, 1}, {{{0, 4}, {4, 6}}, 3}, {{{0, 1}, {1, 3}, {3, 4}, {4, 6}}, 4}}), ref);
}

TEST_CASE("bf16 autocast: near fp32 but not equal to it, any split alike, replicas bitwise equal, state in fp32") {
  auto s = small_setup();
  const auto fp32 = train_pipelines(s, {{{{0, 6}}, 8}});
  s.model.precision = oobleck::runtime::precision_kind::bf16;
  const auto one = train_pipelines(s, {{{{0, 6}}, 8}});
  const auto split = train_pipelines(s, {{{{0, 3}, {3, 6}}, 3}, {{{0, 1}, {1, 4}, {4, 6}}, 5}});
  REQUIRE(one.losses.size() == fp32.losses.size());
  CHECK(one.losses != fp32.losses);  // the casts happen
  for (std::size_t k = 0; k < fp32.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(one.losses[k] - fp32.losses[k]) <= 0.02 * fp32.losses[k]);
  }
  CHECK(one.losses.back() < one.losses.front());
  // Another split casts the same values the same way; only the fp32 sums' order differs, as in fp32,
  // but a difference in a weight's last fp32 bits can flip its bf16 rounding (a bf16 step is 2^-8
  // relative), so the runs drift further apart than fp32's 1e-5 (measured 2.7e-4 after 5 steps).
  const double diff = max_relative_difference(split.parameters, one.parameters);
  MESSAGE("bf16, two heterogeneous pipelines against one stage: max ||p - ref|| / ||ref|| = " << diff);
  CHECK(diff < 2e-3);
  for (const auto& holders : split.digests)
    for (auto d : holders) CHECK(d == holders.front());
  for (const auto& layer : split.parameters)
    for (const auto& p : layer) CHECK((p.scalar_type() == torch::kFloat32));
}

TEST_CASE("activation checkpointing changes memory, not results") {
  auto s = small_setup();
  const auto plain = train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}});
  s.activation_checkpointing = true;
  const auto recomputed = train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}});
  CHECK(max_relative_difference(recomputed, plain) < 1e-6);
}

namespace {

/// A GPT-2 of the harness's sizes, its LM head tied to the token embedding.
training_setup tied_setup() {
  auto s = small_setup();
  s.model.architecture = oobleck::runtime::model_architecture::gpt2;
  s.model.tie_embeddings = true;
  return s;
}

void check_tied_copies_equal(const training_result& r) {
  REQUIRE(r.tied_digests.size() >= 2);
  for (auto d : r.tied_digests) CHECK(d == r.tied_digests.front());
}

}  // namespace

TEST_CASE("tied embeddings: one stage, and 2, 3 and 4 stages, train like one process and keep both copies equal") {
  const auto s = tied_setup();
  const auto ref = train_reference(s);
  check_tied_copies_equal(ref);
  for (const auto& shape : std::vector<std::vector<pipeline_shape>>{
           {{{{0, 6}}, 8}},
           {{{{0, 3}, {3, 6}}, 8}},
           {{{{0, 1}, {1, 4}, {4, 6}}, 8}},
           {{{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, 8}},
           // Two pipelines of other depths: the tied sum after the all-reduce is the same bits in both.
           {{{{0, 3}, {3, 6}}, 3}, {{{0, 1}, {1, 4}, {4, 6}}, 5}},
       }) {
    CAPTURE(shape.size());
    CAPTURE(shape.front().stages.size());
    const auto got = train_pipelines(s, shape);
    check_equivalent(got, ref, 1e-4);
    check_tied_copies_equal(got);
  }
}

TEST_CASE("tied embeddings: without the sum across stages the copies drift apart and training differs") {
  // The test above would pass for an untied model too; this one shows the tie is what it checks:
  // the same GPT-2 untied trains differently from the tied reference.
  auto untied = tied_setup();
  untied.model.tie_embeddings = false;
  const auto tied_ref = train_reference(tied_setup());
  const auto got = train_pipelines(untied, {{{{0, 3}, {3, 6}}, 8}});
  CHECK(std::abs(got.losses.back() - tied_ref.losses.back()) > 1e-4);
}

TEST_CASE("gradient clipping by the global norm: pipelines scale like one process's clip_grad_norm_") {
  for (const bool tie : {false, true}) {
    CAPTURE(tie);
    auto s = tie ? tied_setup() : small_setup();
    const auto unclipped = train_reference(s);
    // Half the first step's norm, so that clipping is active from the first step on.
    s.optimizer.clip_norm = 0.05;
    const auto ref = train_reference(s);
    REQUIRE(ref.grad_norms.size() == static_cast<std::size_t>(s.steps));
    CHECK(ref.grad_norms.front() > 2 * s.optimizer.clip_norm);
    CHECK(std::abs(ref.losses.back() - unclipped.losses.back()) > 1e-4);  // the clip changed the run
    for (const auto& shape : std::vector<std::vector<pipeline_shape>>{
             {{{{0, 6}}, 8}},
             {{{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, 8}},
             {{{{0, 3}, {3, 6}}, 3}, {{{0, 1}, {1, 4}, {4, 6}}, 5}},
         }) {
      const auto got = train_pipelines(s, shape);
      check_equivalent(got, ref, tie ? 1e-4 : 1e-5);
      REQUIRE(got.grad_norms.size() == ref.grad_norms.size());
      for (std::size_t k = 0; k < ref.grad_norms.size(); ++k)
        CHECK(got.grad_norms[k] == doctest::Approx(ref.grad_norms[k]).epsilon(1e-5));
    }
  }
}

TEST_CASE("evaluation: a pipeline's forward-only pass gives each window's mean loss, as one process does") {
  namespace rt = oobleck::runtime;
  for (const bool gpt2 : {false, true}) {
    CAPTURE(gpt2);
    auto s = gpt2 ? tied_setup() : small_setup();
    s.model.dropout = 0.1;  // evaluation must not apply it
    const auto& data = test_dataset(s.model.seq_len);
    const int windows = 7;  // not a multiple of the microbatch: the last chunk is short
    std::vector<std::int64_t> ids(windows);
    for (int i = 0; i < windows; ++i) ids[static_cast<std::size_t>(i)] = i;
    const auto [inputs, targets] = data.batch(ids);
    // One process: every layer in eval mode, each window's mean token loss, summed.
    double expected = 0;
    {
      torch::NoGradGuard no_grad;
      auto layers = rt::build_layers(s.model, 0, s.model.num_layers());
      for (int w = 0; w < windows; ++w) {
        torch::Tensor h = inputs.slice(0, w, w + 1);
        for (auto& l : layers) {
          l->eval();
          h = l->forward(h);
        }
        expected += rt::lm_loss(h, targets.slice(0, w, w + 1)).item<double>();
      }
    }
    const std::vector<std::pair<int, int>> stages{{0, 2}, {2, 3}, {3, 6}};
    const int S = static_cast<int>(stages.size());
    fake_hub hub(S);
    rt::executor_options options{.microbatch_size = s.microbatch, .global_microbatches = 8, .optimizer = s.optimizer};
    std::vector<std::unique_ptr<rt::layer_store>> stores;
    std::vector<std::unique_ptr<rt::stage_executor>> executors;
    for (int k = 0; k < S; ++k) {
      stores.push_back(std::make_unique<rt::layer_store>(s.model));
      stores.back()->ensure(stages[k].first, stages[k].second);
      executors.push_back(std::make_unique<rt::stage_executor>(
          *stores.back(), rt::stage_position{stages[k].first, stages[k].second, k, S, k - 1, k + 1, 0, S - 1}, hub.at(k),
          options));
    }
    std::vector<double> sums(S);
    std::vector<std::future<void>> running;
    for (int k = 0; k < S; ++k)
      running.push_back(std::async(std::launch::async, [&, k] { sums[k] = executors[k]->run_eval(windows, inputs, targets); }));
    wait_or_fail(running, std::chrono::seconds(30), "an evaluation stage", [&] { hub.abort_all(); });
    for (auto& f : running) f.get();
    CHECK(sums.back() == doctest::Approx(expected).epsilon(1e-6));
    CHECK(sums.front() == 0);
    // Training mode again afterwards: the next step's dropout is drawn.
    CHECK(stores.front()->module(0).is_training());
  }
}
