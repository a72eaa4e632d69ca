// Layer store (ARCHITECTURE.md §5): a layer's full state moves as bytes (whole, buffer by buffer,
// on several threads at once), and wrong bytes are refused with nothing changed. What a node keeps
// across epochs and the dropout masks are in layer_store_training_test.cpp.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "runtime/layer_store.hpp"
#include "staged_pipeline.hpp"

using namespace oobleck;
using runtime::layer_store;
using testing::bitwise_equal;
using testing::moments;
using testing::staged_pipeline;


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
