// Layer store (ARCHITECTURE.md §5): a layer's full state moves as bytes, a node keeps its layers across
// epochs, and dropout masks are a function of (seed, step, microbatch, layer).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "runtime/layer_store.hpp"
#include "support/cluster_harness.hpp"

using namespace oobleck;
using runtime::layer_store;
using testing::fake_hub;

namespace {

/// One pipeline of `ranges` stages on threads, one store per stage (a node each), all B/b
/// microbatches. view() starts a new epoch: new views over the same stores.
struct staged_pipeline {
  testing::training_setup setup;
  std::vector<std::unique_ptr<layer_store>> stores;
  std::unique_ptr<fake_hub> hub;
  std::vector<std::unique_ptr<runtime::stage_executor>> views;

  staged_pipeline(testing::training_setup s, const std::vector<std::pair<int, int>>& ranges) : setup(std::move(s)) {
    for (const auto& [u, v] : ranges) {
      stores.push_back(std::make_unique<layer_store>(setup.model));
      stores.back()->ensure(u, v);
    }
    view(ranges);
  }

  void view(const std::vector<std::pair<int, int>>& ranges) {
    views.clear();
    hub = std::make_unique<fake_hub>(static_cast<int>(ranges.size()));
    const runtime::executor_options options{.microbatch_size = setup.microbatch,
                                            .global_microbatches = setup.global_batch / setup.microbatch,
                                            .activation_checkpointing = setup.activation_checkpointing,
                                            .optimizer = setup.optimizer};
    const int S = static_cast<int>(ranges.size());
    for (int k = 0; k < S; ++k)
      views.push_back(std::make_unique<runtime::stage_executor>(
          *stores[k], runtime::stage_position{ranges[k].first, ranges[k].second, k, S, k - 1, k + 1}, hub->at(k),
          options));
  }

  /// Forward and backward of step k; returns the mean loss. Gradients stay until commit/discard.
  double run(std::int64_t k) {
    const auto& data = testing::test_dataset(setup.model.seq_len);
    const runtime::sampler sampler(setup.data_seed, data.size(), setup.global_batch);
    const auto [in, out] = data.batch(sampler.step_samples(k));
    const int M = setup.global_batch / setup.microbatch;
    std::vector<double> loss(views.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < views.size(); ++r)
      threads.emplace_back([&, r] { loss[r] = views[r]->run_step(k, 0, M, in, out); });
    for (auto& t : threads) t.join();
    return loss.back() / M;
  }
  void train(std::int64_t from, std::int64_t to) {
    for (auto k = from; k < to; ++k) {
      run(k);
      for (auto& v : views) v->commit();
    }
  }
  /// Every layer's gradient buffer, in layer order.
  std::vector<torch::Tensor> gradients() {
    std::vector<torch::Tensor> out;
    for (auto& v : views)
      for (int l = v->position().first_layer; l < v->position().end_layer; ++l)
        out.push_back(stores[v->position().stage]->gradients(l).clone());
    return out;
  }
  void discard() {
    for (auto& v : views) v->discard();
  }
};

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  return testing::max_relative_difference(std::vector<std::vector<torch::Tensor>>{a},
                                          std::vector<std::vector<torch::Tensor>>{b});
}

std::vector<torch::Tensor> moments(layer_store& s, int layer) {
  const auto& o = s.optimizer_state(layer);
  auto out = o.exp_avg;
  out.insert(out.end(), o.exp_avg_sq.begin(), o.exp_avg_sq.end());
  return out;
}

testing::training_setup with_dropout(double p) {
  auto s = testing::small_setup();
  s.model.dropout = p;
  return s;
}

}  // namespace

TEST_CASE("word_sum_digest (a GPU's digest): equal bytes equal it, a changed or swapped word changes it, chunks do not") {
  using oobleck::runtime::word_sum_digest;
  const auto t = torch::randn({1000});
  const auto d = word_sum_digest(1, t);
  CHECK(d == word_sum_digest(1, t.clone()));
  CHECK(d == word_sum_digest(1, t, 7));  // any chunking
  CHECK(d == word_sum_digest(1, t, 1));
  CHECK(d == word_sum_digest(1, t.view({10, 100})));  // the bytes count, not the shape
  CHECK(d != word_sum_digest(2, t));                  // chained from h
  for (const std::int64_t i : {0, 499, 999}) {
    auto flipped = t.clone();
    flipped.view(torch::kInt32)[i].bitwise_xor_(1);  // the lowest bit of one float
    CAPTURE(i);
    CHECK(d != word_sum_digest(1, flipped));
  }
  auto swapped = t.clone();
  swapped[3] = t[4];
  swapped[4] = t[3];
  REQUIRE(!torch::equal(t[3], t[4]));
  CHECK(d != word_sum_digest(1, swapped));
  CHECK(d != word_sum_digest(1, t.slice(0, 0, 999)));  // a word fewer
  const auto m = torch::randn({4, 6});
  CHECK(word_sum_digest(1, m.t()) == word_sum_digest(1, m.t().contiguous()));  // values in logical order
  CHECK_THROWS_AS(word_sum_digest(1, torch::zeros({3}, torch::kUInt8)), std::invalid_argument);
  CHECK_THROWS_AS(word_sum_digest(1, t, 0), std::invalid_argument);
  // A CPU tensor's tensor_digest stays FNV-1a over its bytes (the one digest replicas on CPUs compare).
  CHECK(oobleck::runtime::tensor_digest({t}) != word_sum_digest(1469598103934665603ULL, t));
}

TEST_CASE("a layer's full state round-trips through bytes bitwise") {
  staged_pipeline trained(testing::small_setup(), {{0, 6}});
  trained.train(0, 2);
  auto& a = *trained.stores[0];
  layer_store b(trained.setup.model);
  for (int l : {0, 3, 5}) {
    CAPTURE(l);
    const auto bytes = a.serialize_layer(l);
    b.install_layer(l, bytes);
    CHECK(bitwise_equal(b.parameters(l), a.parameters(l)));
    // Moments that were never updated would round-trip trivially.
    CHECK(a.optimizer_state(l).exp_avg_sq.front().abs().sum().item<double>() > 0);
    CHECK(bitwise_equal(moments(b, l), moments(a, l)));
    CHECK(b.optimizer_state(l).step == 2);
    CHECK(b.parameter_digest(l) == a.parameter_digest(l));
    CHECK((b.serialize_layer(l) == bytes));  // (( )): no byte printing
  }
  CHECK(b.layers_held() == std::vector<int>{0, 3, 5});
}

/// A copy as the stage runs it, without a communicator: the header, then each buffer copied in.
void copy_layer(const layer_store& from, layer_store& to, int layer, int target_layer = -1) {
  const auto source = from.copy_of(layer);
  std::size_t k = 0;
  to.receive_layer(target_layer < 0 ? layer : target_layer, source.header,
                   [&](torch::Tensor& buffer) { buffer.copy_(source.buffers.at(k++)); });
  CHECK(k == source.buffers.size());
}

TEST_CASE("a layer copied buffer by buffer (the copy plan's path) equals the original bitwise") {
  staged_pipeline trained(testing::small_setup(), {{0, 6}});
  trained.train(0, 2);
  auto& a = *trained.stores[0];
  layer_store b(trained.setup.model);
  b.ensure(3);  // held: the copy replaces it
  for (int l : {0, 3, 5}) {
    CAPTURE(l);
    copy_layer(a, b, l);
    CHECK(b.parameter_digest(l) == a.parameter_digest(l));
    CHECK(bitwise_equal(moments(b, l), moments(a, l)));
    CHECK(b.optimizer_state(l).step == 2);
    CHECK((b.serialize_layer(l) == a.serialize_layer(l)));
  }
  // The copy does not share storage with its source.
  CHECK(b.flat_parameters(0).data_ptr() != a.flat_parameters(0).data_ptr());
}

TEST_CASE("a copy with a wrong header, or one whose transfer fails, is refused and changes nothing") {
  staged_pipeline trained(testing::small_setup(), {{0, 6}});
  trained.train(0, 1);
  auto& a = *trained.stores[0];
  layer_store b(trained.setup.model);
  b.ensure(3);
  const auto before = b.serialize_layer(3);
  auto header = a.copy_of(3).header;
  auto refused = [&](std::vector<std::byte> h, const std::string& why, int layer = 3) {
    CAPTURE(why);
    int calls = 0;
    CHECK_THROWS_AS(b.receive_layer(layer, h, [&](torch::Tensor&) { ++calls; }), runtime::layer_install_error);
    CHECK(calls == 0);
  };
  refused(std::vector<std::byte>(header.begin(), header.end() - 1), "short");
  auto flipped = header;
  flipped[20] ^= std::byte{1};
  refused(flipped, "corrupt");
  refused(header, "another layer", 4);
  auto other_model = trained.setup.model;
  other_model.seed += 1;
  layer_store other(other_model);
  other.ensure(3);
  refused(other.copy_of(3).header, "another model");
  // The transfer fails after the first buffer: the held layer stays as it was.
  int calls = 0;
  CHECK_THROWS_AS(b.receive_layer(3, header,
                                  [&](torch::Tensor& buffer) {
                                    if (++calls == 2) throw std::runtime_error("peer lost");
                                    buffer.fill_(7.0f);
                                  }),
                  std::runtime_error);
  CHECK((b.serialize_layer(3) == before));
  CHECK(!b.holds(4));
}

TEST_CASE("layers received on several threads at once (prepare_incoming, then adopt) equal the originals") {
  staged_pipeline trained(testing::small_setup(), {{0, 6}});
  trained.train(0, 2);
  auto& a = *trained.stores[0];
  layer_store b(trained.setup.model);
  b.ensure(3);  // held: the copy replaces it
  const std::vector<int> layers{0, 3, 5};
  std::vector<layer_store::incoming> incoming(layers.size());
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < layers.size(); ++i)
      threads.emplace_back([&, i] {
        incoming[i] = b.prepare_incoming(layers[i]);
        const auto source = a.copy_of(layers[i]);
        auto buffers = incoming[i].buffers();
        REQUIRE(buffers.size() == source.buffers.size());
        for (std::size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(source.buffers[k]);
      });
  }
  // Nothing is held or replaced before adopt().
  CHECK(b.layers_held() == std::vector<int>{3});
  const auto kept = b.serialize_layer(3);
  CHECK((kept != a.serialize_layer(3)));
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    CAPTURE(l);
    CHECK(incoming[i].layer() == l);
    b.adopt(std::move(incoming[i]), a.copy_of(l).header);
    CHECK(b.parameter_digest(l) == a.parameter_digest(l));
    CHECK(bitwise_equal(moments(b, l), moments(a, l)));
    CHECK(b.optimizer_state(l).step == 2);
    CHECK((b.serialize_layer(l) == a.serialize_layer(l)));
    // The module computes with the received values: its parameters are views of the buffers.
    CHECK(bitwise_equal(b.module(l).parameters(), a.module(l).parameters()));
  }
  CHECK_THROWS_AS(b.adopt(std::move(incoming[0]), a.copy_of(0).header), std::logic_error);  // adopted already
  // A wrong header is refused and changes nothing.
  auto in = b.prepare_incoming(4);
  CHECK_THROWS_AS(b.adopt(std::move(in), a.copy_of(3).header), runtime::layer_install_error);
  CHECK(!b.holds(4));
}

/// How many of the pages wholly inside `t`'s bytes are not resident (mincore).
std::size_t missing_pages(const torch::Tensor& t) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  const auto first = (begin + page - 1) / page * page;
  const auto last = (begin + t.nbytes()) / page * page;
  REQUIRE(last > first);
  std::vector<unsigned char> in_core((last - first) / page);
  REQUIRE(::mincore(reinterpret_cast<void*>(first), last - first, in_core.data()) == 0);
  return static_cast<std::size_t>(std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return (c & 1) == 0; }));
}

TEST_CASE("an incoming layer's buffers are resident before the copy writes them (no page faults in the transfer)") {
  // A block of d_model 1024 has ~12.6 M parameters: 50 MB per buffer, above glibc's largest
  // mmap threshold (32 MiB), so each buffer is fresh anonymous memory that nothing has touched.
  runtime::gpt_config model;
  model.d_model = 1024;
  model.heads = 8;
  model.blocks = 1;
  model.seq_len = 8;
  layer_store store(model);
  auto in = store.prepare_incoming(1);
  const auto buffers = in.buffers();
  REQUIRE(buffers.size() == 3);
  for (const auto& b : buffers) {
    CAPTURE(b.nbytes());
    CHECK(b.nbytes() > (std::size_t{32} << 20));
    CHECK(missing_pages(b) == 0);
  }
}

TEST_CASE("an uninitialised layer has the seeded layer's shapes and draws nothing") {
  const auto s = testing::small_setup();
  for (int l : {0, 2, s.model.num_layers() - 1}) {
    CAPTURE(l);
    const auto seeded = runtime::build_layers(s.model, l, l + 1).front()->parameters();
    const auto empty =
        runtime::build_layers(s.model, l, l + 1, torch::kCPU, runtime::layer_init::uninitialised).front()->parameters();
    REQUIRE(seeded.size() == empty.size());
    for (std::size_t k = 0; k < seeded.size(); ++k) CHECK(seeded[k].sizes() == empty[k].sizes());
    // Building uninitialised layers in between changes no seeded layer (each has its own generator).
    CHECK(bitwise_equal(runtime::build_layers(s.model, l, l + 1).front()->parameters(), seeded));
  }
}

TEST_CASE("training continues identically after its layers move to another store") {
  const auto s = testing::small_setup();
  staged_pipeline straight(s, {{0, 6}});
  straight.train(0, 4);

  // Two steps on one node, then every layer moves (as bytes) to a node that never built them.
  staged_pipeline moved(s, {{0, 6}});
  moved.train(0, 2);
  auto fresh = std::make_unique<layer_store>(s.model);
  for (int l = 0; l < s.model.num_layers(); ++l) fresh->install_layer(l, moved.stores[0]->serialize_layer(l));
  moved.views.clear();
  moved.stores[0] = std::move(fresh);
  moved.view({{0, 6}});
  moved.train(2, 4);

  for (int l = 0; l < s.model.num_layers(); ++l) {
    CAPTURE(l);
    CHECK(moved.stores[0]->parameter_digest(l) == straight.stores[0]->parameter_digest(l));
    CHECK(bitwise_equal(moments(*moved.stores[0], l), moments(*straight.stores[0], l)));
    CHECK(moved.stores[0]->optimizer_state(l).step == 4);
  }
}

TEST_CASE("an install of wrong bytes is refused and changes nothing") {
  staged_pipeline trained(testing::small_setup(), {{0, 6}});
  trained.train(0, 1);
  auto& store = *trained.stores[0];
  const auto layer2 = store.serialize_layer(2);
  const auto layer3 = store.serialize_layer(3);
  store.drop(4);

  auto other_model = trained.setup.model;
  other_model.seed += 1;
  layer_store other(other_model);
  other.ensure(3);

  auto torn = layer3;
  torn.resize(torn.size() - 4);
  auto corrupt = layer3;
  corrupt[corrupt.size() / 2] ^= std::byte{0x10};
  auto longer = layer3;
  longer.push_back(std::byte{0});
  auto absurd = layer3;  // element count (header offset 48) far beyond any buffer
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max() / 2;
  std::memcpy(absurd.data() + 48, &huge, sizeof huge);

  const struct {
    const char* name;
    std::vector<std::byte> bytes;
    const char* says;
  } cases[] = {
      {"another layer", layer2, "the bytes hold layer 2"},
      {"another model", other.serialize_layer(3), "the bytes are of model"},
      {"torn", torn, "torn bytes"},
      {"trailing bytes", longer, "torn bytes"},
      {"absurd element count", absurd, "torn bytes"},
      {"corrupt", corrupt, "checksum mismatch"},
      {"empty", {}, "shorter than the 72-byte header"},
      {"not a layer", std::vector<std::byte>(100, std::byte{'x'}), "not a serialised layer"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    // Into a held layer: its parameters, moments and step are untouched.
    CHECK_THROWS_WITH_AS(store.install_layer(3, c.bytes), doctest::Contains(c.says), runtime::layer_install_error);
    CHECK((store.serialize_layer(3) == layer3));
    // Into a layer the store does not hold: it still does not.
    const auto as4 = std::string(c.name) == "another layer" ? layer3 : c.bytes;
    CHECK_THROWS_AS(store.install_layer(4, as4), runtime::layer_install_error);
    CHECK(!store.holds(4));
  }
  CHECK(store.layers_held() == std::vector<int>{0, 1, 2, 3, 5});
  CHECK_THROWS_AS(store.install_layer(6, layer3), std::invalid_argument);
}

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
