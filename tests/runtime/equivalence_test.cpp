// Pipelines of stage executors must train exactly like plain LibTorch (issue: stage execution).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include "support/cluster_harness.hpp"

using namespace oobleck::testing;

namespace {

void check_equivalent(const training_result& got, const training_result& reference) {
  // fp32 sums in another order (microbatches, pipelines, all-reduce) differ in the last bits and
  // AdamW rescales tiny gradients, so elements differ slightly; tensors agree to 1e-5 relative.
  const double diff = max_relative_difference(got, reference);
  MESSAGE("after " << reference.losses.size() << " steps: max ||p - ref|| / ||ref|| = " << diff
                   << ", max elementwise |p - ref| / max|ref| = " << max_elementwise_difference(got, reference));
  CHECK(diff < 1e-5);
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

TEST_CASE("activation checkpointing changes memory, not results") {
  auto s = small_setup();
  const auto plain = train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}});
  s.activation_checkpointing = true;
  const auto recomputed = train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}});
  CHECK(max_relative_difference(recomputed, plain) < 1e-6);
}
