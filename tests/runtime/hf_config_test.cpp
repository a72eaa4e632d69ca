// Hugging Face GPT-2's names and config.json (runtime/hf_gpt2.hpp) and data sources
// (runtime/data_source.hpp), without LibTorch.
#include "runtime/hf_gpt2.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "runtime/data_source.hpp"

using namespace oobleck::runtime;
namespace fs = std::filesystem;

namespace {

gpt_config tiny_gpt2(bool tie) {
  gpt_config c;
  c.architecture = model_architecture::gpt2;
  c.vocab = 300;
  c.d_model = 16;
  c.heads = 2;
  c.blocks = 3;
  c.seq_len = 8;
  c.tie_embeddings = tie;
  return c;
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("oobleck_hf_config_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("hf_gpt2: every parameter has one Hugging Face name, Conv1D weights are transposed, lm_head only untied") {
  for (const bool tie : {true, false}) {
    CAPTURE(tie);
    const auto c = tiny_gpt2(tie);
    std::set<std::string> names;
    int written = 0;
    for (int l = 0; l < c.num_layers(); ++l)
      for (const auto& p : hf_parameters(c, l)) {
        const bool tied_copy = tie && l == c.num_layers() - 1 && p.name == "transformer.wte.weight";
        if (!tied_copy) CHECK(names.insert(p.name).second);
        ++written;
      }
    CHECK(names.count("transformer.h.2.mlp.c_proj.bias") == 1);
    CHECK(names.count("transformer.h.3.ln_1.weight") == 0);
    CHECK(names.count("lm_head.weight") == (tie ? 0 : 1));
    CHECK(names.size() == static_cast<std::size_t>(2 + 12 * c.blocks + 2 + (tie ? 0 : 1)));
    CHECK(written == 2 + 12 * c.blocks + 3);
  }
  const auto block = hf_parameters(tiny_gpt2(true), 1);
  REQUIRE(block.size() == 12);
  CHECK(block[2].name == "transformer.h.0.attn.c_attn.weight");
  CHECK(block[2].shape == std::vector<std::int64_t>{48, 16});
  CHECK(block[2].transposed);
  CHECK_FALSE(block[3].transposed);
  CHECK(block[10].shape == std::vector<std::int64_t>{16, 64});
  CHECK(hf_parameters(tiny_gpt2(true), 4).front().name == "transformer.wte.weight");  // index 0: the tied copy
  CHECK_THROWS_AS(hf_parameters(gpt_config{}, 0), std::invalid_argument);  // oobleck-gpt has no HF names
}

TEST_CASE("hf_gpt2: config.json round-trips and a job that disagrees with it is refused naming the key") {
  const auto c = tiny_gpt2(true);
  const auto dir = scratch("config");
  std::ofstream(dir / "config.json") << hf_config_json(c);
  const auto back = config_from_hf((dir / "config.json").string());
  CHECK(back.vocab == c.vocab);
  CHECK(back.d_model == c.d_model);
  CHECK(back.heads == c.heads);
  CHECK(back.blocks == c.blocks);
  CHECK(back.seq_len == c.seq_len);
  CHECK(back.tie_embeddings);
  CHECK(back.architecture == model_architecture::gpt2);
  CHECK_NOTHROW(check_hf_config(c, dir.string()));

  auto other = c;
  other.d_model = 32;
  other.heads = 4;
  CHECK_THROWS_WITH_AS(check_hf_config(other, dir.string()),
                       "config.json n_embd 16 disagrees with [model] d_model 32", std::invalid_argument);
  other = c;
  other.seq_len = 9;
  CHECK_THROWS_WITH_AS(check_hf_config(other, dir.string()), doctest::Contains("n_positions 8 disagrees with [model] seq_len 9"),
                       std::invalid_argument);
  other = c;
  other.tie_embeddings = false;
  CHECK_THROWS_WITH_AS(check_hf_config(other, dir.string()),
                       doctest::Contains("tie_word_embeddings true disagrees with [model] tie_embeddings false"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_hf_config(gpt_config{}, dir.string()), doctest::Contains("architecture = \"gpt2\""),
                       std::invalid_argument);

  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 300, "n_positions": 8, "n_embd": 16,
    "n_layer": 3, "n_head": 2, "activation_function": "relu"})";
  CHECK_THROWS_WITH_AS(check_hf_config(c, dir.string()), doctest::Contains("activation_function"), std::invalid_argument);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama"})";
  CHECK_THROWS_WITH_AS(check_hf_config(c, dir.string()), doctest::Contains("only \"gpt2\""), std::invalid_argument);
  std::ofstream(dir / "config.json") << "{";
  CHECK_THROWS_WITH_AS(check_hf_config(c, dir.string()), doctest::Contains("not valid JSON"), std::invalid_argument);
  fs::remove(dir / "config.json");
  CHECK_THROWS_WITH_AS(check_hf_config(c, dir.string()), doctest::Contains("cannot read"), std::invalid_argument);
  fs::remove_all(dir);
}

TEST_CASE("data_source: token counts from file sizes, odd sizes and missing files are refused naming the path") {
  const auto dir = scratch("data");
  std::ofstream(dir / "ten.bin", std::ios::binary) << std::string(10, 'x');
  std::ofstream(dir / "odd.bin", std::ios::binary) << std::string(7, 'x');
  CHECK(token_count(data_source::token_file((dir / "ten.bin").string(), token_dtype::uint16)) == 5);
  CHECK(token_count(data_source::text_file((dir / "odd.bin").string())) == 7);
  CHECK_THROWS_WITH_AS(token_count(data_source::token_file((dir / "ten.bin").string(), token_dtype::uint32)),
                       doctest::Contains("10 bytes is not a whole number of uint32 token ids"), std::runtime_error);
  CHECK_THROWS_WITH_AS(token_count(data_source::token_file((dir / "odd.bin").string())),
                       doctest::Contains((dir / "odd.bin").string().c_str()), std::runtime_error);
  CHECK_THROWS_WITH_AS(token_count(data_source::token_file((dir / "none.bin").string())),
                       doctest::Contains((dir / "none.bin").string().c_str()), std::runtime_error);
  CHECK(token_count(data_source::generated(1000, 3)) == 1000);
  CHECK(windows_in(33, 8) == 4);
  CHECK(windows_in(32, 8) == 3);
  CHECK(parse_dtype("uint32") == token_dtype::uint32);
  CHECK_THROWS_AS(parse_dtype("int16"), std::invalid_argument);
  CHECK(describe(data_source::generated()) == "generated 1048576 7");
  fs::remove_all(dir);
}
