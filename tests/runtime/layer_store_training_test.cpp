// Layer store (ARCHITECTURE.md §5): a node keeps its layers across epochs (stage views over the
// same store), dropout masks are a function of (seed, step, microbatch, layer), and gradient
// buffers stay allocated. How a layer's state moves as bytes is in layer_store_test.cpp.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include "runtime/layer_store.hpp"
#include "staged_pipeline.hpp"

using namespace oobleck;
using runtime::layer_store;
using testing::bitwise_equal;
using testing::staged_pipeline;
using testing::fake_hub;
using testing::max_relative_difference;
using testing::with_dropout;

TEST_CASE("a stage view needs every layer of its range in the store") {
  const auto s = testing::small_setup();
  layer_store store(s.model);
  store.ensure(0, 2);
  fake_hub hub(1);
  CHECK_THROWS_WITH_AS(runtime::stage_executor(store, {0, 3, 0, 1, -1, -1}, hub.at(0), {}),
                       doctest::Contains("need layer 2, which the node's store does not hold"), std::invalid_argument);
  runtime::stage_executor view(store, {0, 2, 0, 1, -1, -1}, hub.at(0), {});
  CHECK_THROWS_AS(view.parameters(2), std::out_of_range);
}

TEST_CASE("a node keeps the layers it still holds when its stages change") {
  const auto s = testing::small_setup();
  staged_pipeline straight(s, {{0, 3}, {3, 6}});
  straight.train(0, 4);

  staged_pipeline p(s, {{0, 3}, {3, 6}});
  p.train(0, 2);
  auto& a = *p.stores[0];
  auto& b = *p.stores[1];
  std::vector<std::vector<std::byte>> kept;
  std::vector<const void*> storage;
  for (int l : {0, 1, 2, 4, 5}) {
    kept.push_back((l < 3 ? a : b).serialize_layer(l));
    storage.push_back((l < 3 ? a : b).flat_parameters(l).data_ptr());
  }
  // Next epoch: node a runs [0, 4), node b [4, 6). Layer 3 is copied from b to a, b drops it.
  p.views.clear();
  a.install_layer(3, b.serialize_layer(3));
  b.drop(3);
  p.view({{0, 4}, {4, 6}});
  CHECK(a.layers_held() == std::vector<int>{0, 1, 2, 3});
  CHECK(b.layers_held() == std::vector<int>{4, 5});
  int i = 0;
  for (int l : {0, 1, 2, 4, 5}) {
    CAPTURE(l);
    auto& holder = l < 3 ? a : b;
    CHECK((holder.serialize_layer(l) == kept[i]));  // bitwise: parameters, moments, step
    CHECK(holder.flat_parameters(l).data_ptr() == storage[i]);  // the same memory, not a rebuild
    ++i;
  }
  p.train(2, 4);
  for (int l = 0; l < s.model.num_layers(); ++l) {
    CAPTURE(l);
    const auto& before = l < 3 ? *straight.stores[0] : *straight.stores[1];
    const auto& after = l < 4 ? a : b;
    CHECK(after.parameter_digest(l) == before.parameter_digest(l));
  }
}

TEST_CASE("a re-run step with dropout draws the same masks: bitwise identical gradients") {
  staged_pipeline p(with_dropout(0.1), {{0, 2}, {2, 6}});
  const double loss = p.run(3);
  const auto first = p.gradients();
  p.discard();
  CHECK(p.run(3) == loss);
  CHECK(bitwise_equal(p.gradients(), first));
  p.discard();
  // The masks do depend on the step (and so are really drawn).
  p.run(4);
  const auto other_step = p.gradients();
  p.discard();
  staged_pipeline no_dropout(with_dropout(0.0), {{0, 2}, {2, 6}});
  no_dropout.run(3);
  CHECK(max_relative_difference(no_dropout.gradients(), first) > 1e-3);
  CHECK(!bitwise_equal(other_step, first));
}

TEST_CASE("activation checkpointing with dropout recomputes the same masks: same gradients") {
  auto s = with_dropout(0.1);
  staged_pipeline plain(s, {{0, 2}, {2, 6}});
  plain.run(0);
  s.activation_checkpointing = true;
  staged_pipeline recomputed(s, {{0, 2}, {2, 6}});
  recomputed.run(0);
  // The recompute repeats the forward op for op, masks included: not close, equal.
  CHECK(bitwise_equal(recomputed.gradients(), plain.gradients()));
  // And over several committed steps.
  s.steps = 3;
  const auto trained = testing::train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}});
  s.activation_checkpointing = false;
  CHECK(testing::max_relative_difference(trained, testing::train_pipelines(s, {{{{0, 2}, {2, 6}}, 8}})) < 1e-6);
}

TEST_CASE("with dropout, different pipeline splits train like the plain loop") {
  auto s = with_dropout(0.1);
  s.steps = 3;
  const auto reference = testing::train_reference(s);
  auto no_dropout = s;
  no_dropout.model.dropout = 0;
  // Dropout really changes the training, so agreement below is not trivial.
  CHECK(testing::max_relative_difference(testing::train_reference(no_dropout), reference) > 1e-4);
  const std::vector<std::vector<testing::pipeline_shape>> splits{
      {{{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, 8}},
      {{{{0, 3}, {3, 6}}, 3}, {{{0, 1}, {1, 4}, {4, 6}}, 5}},
  };
  for (const auto& split : splits) {
    CAPTURE(split.size());
    const auto got = testing::train_pipelines(s, split);
    const double diff = testing::max_relative_difference(got, reference);
    const double grad_diff = testing::max_relative_difference(got.first_gradients, reference.first_gradients);
    MESSAGE(split.size() << " pipeline(s), dropout 0.1: parameters " << diff << ", step 0 gradients " << grad_diff);
    CHECK(diff < 1e-5);
    CHECK(grad_diff < 1e-5);
    for (std::size_t k = 0; k < reference.losses.size(); ++k)
      CHECK(got.losses[k] == doctest::Approx(reference.losses[k]).epsilon(1e-5));
  }
}

TEST_CASE("gradient buffers stay allocated across steps and start every step at zero") {
  // A step neither frees nor re-allocates a layer's gradients: the buffer (and the parameters'
  // .grad(), its views) outlives commit and discard, and is zeroed in place when the next step
  // starts, so the next step's gradients are its own alone.
  staged_pipeline p(testing::small_setup(), {{0, 3}, {3, 6}});
  auto& store = *p.stores[1];
  p.run(0);
  const void* buffer = store.gradients(4).data_ptr();
  const auto first = p.gradients();
  p.discard();
  CHECK(store.parameters(4)[0].grad().defined());
  CHECK(store.parameters(4)[0].grad().data_ptr() == buffer);
  p.run(0);  // the same step again: the discarded gradients did not add to it
  CHECK(bitwise_equal(p.gradients(), first));
  CHECK(store.gradients(4).data_ptr() == buffer);
  for (auto& v : p.views) v->commit();
  CHECK(store.parameters(4)[0].grad().data_ptr() == buffer);
  CHECK(store.gradients(4).abs().sum().item<double>() == 0);  // cleared: zero at the next use
  CHECK(store.gradients(4).data_ptr() == buffer);

  // Training with buffers kept equals training where every step starts from fresh stores' state.
  staged_pipeline kept(testing::small_setup(), {{0, 3}, {3, 6}});
  kept.train(0, 3);
  staged_pipeline moved(testing::small_setup(), {{0, 3}, {3, 6}});
  for (int k = 0; k < 3; ++k) {
    moved.train(k, k + 1);
    // A new epoch every step: new views over layers that arrive by install (stale gradients cleared).
    for (auto& s : moved.stores)
      for (int l : s->layers_held()) s->install_layer(l, s->serialize_layer(l));
    moved.view({{0, 3}, {3, 6}});
  }
  for (int l = 0; l < 6; ++l) {
    CAPTURE(l);
    CHECK(kept.stores[l < 3 ? 0 : 1]->parameter_digest(l) == moved.stores[l < 3 ? 0 : 1]->parameter_digest(l));
  }
  // A layer the node drops takes its buffers with it.
  store.drop(4);
  CHECK(!store.holds(4));
  CHECK_THROWS_AS(store.gradients(4), std::out_of_range);
}
