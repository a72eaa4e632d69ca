// Hugging Face GPT-2 weights in and out of a layer store (runtime/hf_gpt2_weights.hpp) and the
// held-out evaluation (runtime/evaluate.hpp): export -> [model] init is bitwise, bad files are
// refused naming the tensor, and evaluate is the mean of the windows' mean cross-entropies.
#include <torch/torch.h>

#include "runtime/evaluate.hpp"
#include "runtime/hf_gpt2.hpp"
#include "runtime/hf_gpt2_weights.hpp"
#include "runtime/layer_store.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace oobleck::runtime;
namespace fs = std::filesystem;

namespace {

gpt_config tiny_gpt2(bool tie, std::uint64_t seed) {
  gpt_config c;
  c.architecture = model_architecture::gpt2;
  c.vocab = 259;
  c.d_model = 16;
  c.heads = 2;
  c.blocks = 2;
  c.seq_len = 8;
  c.tie_embeddings = tie;
  c.seed = seed;
  return c;
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("oobleck_hf_weights_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Layers that differ from their seed: one made-up update per parameter, so that a round trip that
/// rebuilt from a seed could not pass.
void perturb(layer_store& s) {
  torch::NoGradGuard g;
  for (int l = 0; l < s.model().num_layers(); ++l) {
    auto flat = s.flat_parameters(l);
    flat.add_(torch::arange(flat.numel(), torch::kFloat32).sin() * 1e-3);
  }
  if (tied(s.model())) s.parameters(s.model().num_layers() - 1)[0].copy_(s.parameters(0)[0]);
}

}  // namespace

TEST_CASE("export then init from the export: every layer's parameters come back bitwise, the optimizer state fresh") {
  for (const bool tie : {true, false}) {
    CAPTURE(tie);
    layer_store trained(tiny_gpt2(tie, 11));
    trained.ensure(0, trained.model().num_layers());
    perturb(trained);
    const auto dir = scratch(tie ? "tied" : "untied");
    export_hf(trained, dir.string());
    CHECK(fs::exists(dir / "config.json"));
    const auto file = safetensors_file::read((dir / "model.safetensors").string());
    CHECK((file.find("lm_head.weight") != nullptr) == !tie);
    CHECK(file.find("transformer.h.1.mlp.c_fc.weight")->shape == std::vector<std::int64_t>{16, 64});  // Conv1D layout
    CHECK(file.metadata().at("format") == "pt");
    CHECK_NOTHROW(check_hf_config(trained.model(), dir.string()));

    auto c = tiny_gpt2(tie, 99);  // another seed: only init can make the values equal
    c.init = dir.string();
    layer_store loaded(c);
    layer_store seeded(tiny_gpt2(tie, 99));
    for (int l = 0; l < c.num_layers(); ++l) {
      CAPTURE(l);
      loaded.ensure(l);
      seeded.ensure(l);
      CHECK(torch::equal(loaded.flat_parameters(l), trained.flat_parameters(l)));
      CHECK_FALSE(torch::equal(seeded.flat_parameters(l), trained.flat_parameters(l)));
      CHECK(loaded.optimizer_state(l).step == 0);
      CHECK(loaded.optimizer_state(l).exp_avg.front().abs().sum().item<float>() == 0);
    }
    if (tie) CHECK(torch::equal(loaded.parameters(c.num_layers() - 1)[0], loaded.parameters(0)[0]));
    fs::remove_all(dir);
  }
}

TEST_CASE("model init: a missing tensor or a wrong shape is refused naming the tensor") {
  layer_store trained(tiny_gpt2(true, 3));
  trained.ensure(0, trained.model().num_layers());
  const auto dir = scratch("bad");
  export_hf(trained, dir.string());
  // Rewrite the file without one tensor, and with another of the wrong shape.
  const auto file = safetensors_file::read((dir / "model.safetensors").string());
  std::vector<std::vector<float>> keep;
  std::vector<safetensors_tensor> tensors;
  for (const auto& e : file.tensors()) {
    if (e.name == "transformer.h.0.ln_2.bias") continue;
    keep.push_back(file.floats(e));
    auto shape = e.shape;
    if (e.name == "transformer.wpe.weight") shape = {shape[1], shape[0]};
    tensors.push_back({e.name, shape, keep.back()});
  }
  write_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  auto c = tiny_gpt2(true, 3);
  c.init = dir.string();
  layer_store loaded(c);
  CHECK_THROWS_WITH_AS(loaded.ensure(1), doctest::Contains("no tensor transformer.h.0.ln_2.bias"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(loaded.ensure(0), doctest::Contains("transformer.wpe.weight has shape [16, 8], the model needs [8, 16]"),
                       std::invalid_argument);
  CHECK_FALSE(loaded.holds(0));
  CHECK_NOTHROW(loaded.ensure(2));
  fs::remove_all(dir);
  CHECK_THROWS_WITH_AS(loaded.ensure(3), doctest::Contains("model.safetensors"), std::invalid_argument);
}

TEST_CASE("evaluate: the mean over windows of each window's mean cross-entropy, without dropout") {
  auto c = tiny_gpt2(true, 5);
  c.dropout = 0.5;  // evaluation must not draw it
  layer_store store(c);
  store.ensure(0, c.num_layers());
  std::string text;
  for (int i = 0; i < 200; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  const token_dataset data(text, c.seq_len);
  const double loss = evaluate(store, data, 5, 2);
  // By hand: each window alone, eval mode.
  double sum = 0;
  for (std::int64_t w = 0; w < 5; ++w) {
    auto [x, y] = data.batch({w});
    for (int l = 0; l < c.num_layers(); ++l) {
      store.module(l).eval();
      x = store.module(l).forward(x, nullptr);
    }
    sum += lm_loss(x, y).item<double>();
  }
  CHECK(loss == doctest::Approx(sum / 5).epsilon(1e-6));
  CHECK(evaluate(store, data, 5, 5) == doctest::Approx(loss).epsilon(1e-6));
  CHECK(evaluate(store, data, 4, 2) != doctest::Approx(loss).epsilon(1e-9));  // the windows count
  for (int l = 0; l < c.num_layers(); ++l) store.module(l).train();
  evaluate(store, data, 1);
  CHECK(store.module(1).is_training());  // restored
  CHECK_THROWS_WITH_AS(evaluate(store, data, data.size() + 1), doctest::Contains("holds only"), std::invalid_argument);
  CHECK_THROWS_AS(evaluate(store, data, 0), std::invalid_argument);
}
