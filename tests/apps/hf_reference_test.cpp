// GPT-2 weights in and out against PyTorch itself (issue 24, item 6): a model trained here and
// exported by oobleck-export is read by a GPT-2 built from torch.nn primitives
// (tests/python/gpt2_reference.py) with the same held-out loss as oobleck-eval's, within 1e-5
// relative; and weights PyTorch writes give oobleck-eval PyTorch's loss. Needs /usr/bin/python3
// with torch (Debian's python3-torch); without it every case says SKIPPED and passes.
#include <torch/torch.h>

#include "actors/stage.hpp"
#include "apps/checkpoint_model.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/layer_store.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/subprocess.hpp"

using namespace oobleck;
namespace fs = std::filesystem;

namespace {

const std::string apps_dir = OOBLECK_APPS_DIR;
const std::string script = std::string(OOBLECK_SOURCE_DIR) + "/tests/python/gpt2_reference.py";
const std::string python = "/usr/bin/python3";

bool python_torch() {
  static const bool ok = testing::run_process(python, {"-c", "import torch"}).exit_status == 0;
  if (!ok) MESSAGE("SKIPPED: /usr/bin/python3 cannot import torch (install python3-torch)");
  return ok;
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("oobleck_hf_reference_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

runtime::gpt_config tiny_gpt2(bool tie) {
  runtime::gpt_config c;
  c.architecture = runtime::model_architecture::gpt2;
  c.vocab = 300;
  c.d_model = 32;
  c.heads = 4;
  c.blocks = 2;
  c.seq_len = 16;
  c.dropout = 0.1;  // trained with it; evaluated without
  c.tie_embeddings = tie;
  c.seed = 21;
  return c;
}

/// `count` uint16 ids below vocab, drawn from a seeded generator.
std::string token_file(const fs::path& dir, std::int64_t vocab, int count) {
  const auto path = (dir / "val.bin").string();
  std::mt19937 rng(5);
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const auto id = static_cast<std::uint16_t>(rng() % static_cast<std::uint32_t>(vocab));
    out.put(static_cast<char>(id & 0xff)).put(static_cast<char>(id >> 8));
  }
  return path;
}

/// A checkpoint as a job writes it (manifest, layer files, model.toml) of the given layers' bytes.
fs::path write_checkpoint(const fs::path& root, const runtime::gpt_config& model,
                          const std::vector<std::vector<std::byte>>& layers) {
  const auto temp = runtime::begin_checkpoint(root, 3);
  runtime::checkpoint_manifest m;
  m.job_hash = "test";
  m.step = 3;
  m.num_layers = model.num_layers();
  for (int l = 0; l < model.num_layers(); ++l) m.files.push_back(runtime::write_layer_file(temp, l, layers[l]));
  const auto dir = runtime::finish_checkpoint(temp, m);
  std::ofstream(dir / apps::checkpoint_model_file) << apps::checkpoint_model_toml(model);
  return dir;
}

double loss_of(const testing::process_result& r) {
  INFO(r.err);
  REQUIRE(r.exit_status == 0);
  const auto j = nlohmann::json::parse(r.out);
  return j.at("loss").get<double>();
}

double oobleck_eval(const std::vector<std::string>& model_args, const std::string& tokens, int windows) {
  auto args = model_args;
  for (const std::string& a : {std::string("--tokens"), tokens, std::string("--windows"), std::to_string(windows),
                               std::string("--json")})
    args.push_back(a);
  return loss_of(testing::run_process(apps_dir + "/oobleck-eval", args));
}

double pytorch_eval(const std::string& model_dir, const std::string& tokens, int windows) {
  return loss_of(testing::run_process(
      python, {script, "eval", "--model", model_dir, "--tokens", tokens, "--windows", std::to_string(windows)}));
}

}  // namespace

TEST_CASE("PyTorch's GPT-2 reads oobleck-export's weights of a trained checkpoint with oobleck-eval's loss") {
  if (!python_torch()) return;
  for (const bool tie : {false, true}) {
    CAPTURE(tie);
    const auto dir = scratch(tie ? "export_tied" : "export_untied");
    const auto model = tiny_gpt2(tie);
    std::vector<std::vector<std::byte>> layers;
    if (!tie) {
      // Trained: three AdamW steps on the generated corpus, every layer in one process.
      actors::stage_job job;
      job.model = model;
      job.global_batch = 4;
      job.microbatch = 2;
      job.train = runtime::data_source::generated(1 << 14, 3);
      job.optimizer.lr.peak = 3e-3;
      job.optimizer.lr.total_steps = 3;
      actors::train_single_process(job, 3, &layers);
    } else {
      // Tied: the seed's values (training a tied model needs the embedding group's gradient sum).
      runtime::layer_store store(model);
      store.ensure(0, model.num_layers());
      for (int l = 0; l < model.num_layers(); ++l) layers.push_back(store.serialize_layer(l));
    }
    const auto checkpoint = write_checkpoint(dir / "checkpoints", model, layers);
    const auto tokens = token_file(dir, model.vocab, 20 * 16 + 1);
    const auto out = (dir / "hf").string();
    const auto exported = testing::run_process(apps_dir + "/oobleck-export", {"--checkpoint", checkpoint.string(), "--out", out});
    INFO(exported.err);
    REQUIRE(exported.exit_status == 0);

    const double ours = oobleck_eval({"--checkpoint", checkpoint.string()}, tokens, 20);
    const double from_export = oobleck_eval({"--model", out}, tokens, 20);
    const double theirs = pytorch_eval(out, tokens, 20);
    CHECK(from_export == ours);  // the same values, the same code: bitwise
    CHECK(std::abs(theirs - ours) <= 1e-5 * std::abs(ours));
    CHECK(std::abs(pytorch_eval(out, tokens, 7) - oobleck_eval({"--model", out}, tokens, 7)) <= 1e-5 * std::abs(ours));
    fs::remove_all(dir);
  }
}

TEST_CASE("oobleck-eval reads weights PyTorch writes with PyTorch's loss") {
  if (!python_torch()) return;
  for (const bool tie : {true, false}) {
    CAPTURE(tie);
    const auto dir = scratch(tie ? "import_tied" : "import_untied");
    const auto out = (dir / "hf").string();
    std::vector<std::string> args{script, "write", "--out", out, "--vocab", "300", "--d-model", "32", "--heads", "4",
                                  "--blocks", "3", "--seq-len", "16", "--seed", tie ? "1" : "2"};
    if (!tie) args.push_back("--untied");
    const auto written = testing::run_process(python, args);
    INFO(written.err);
    REQUIRE(written.exit_status == 0);
    const auto tokens = token_file(dir, 300, 12 * 16 + 1);
    const double theirs = pytorch_eval(out, tokens, 12);
    const double ours = oobleck_eval({"--model", out}, tokens, 12);
    CHECK(std::abs(theirs - ours) <= 1e-5 * std::abs(theirs));
    // A job with [model] init starts from exactly these values: its seeded layers are overwritten.
    auto c = tiny_gpt2(tie);
    c.blocks = 3;
    c.init = out;
    runtime::layer_store store(c);
    store.ensure(0, c.num_layers());
    c.init.clear();
    runtime::layer_store seeded(c);
    seeded.ensure(0, c.num_layers());
    CHECK_FALSE(torch::equal(store.flat_parameters(1), seeded.flat_parameters(1)));
    fs::remove_all(dir);
  }
}

TEST_CASE("oobleck-export and oobleck-eval refuse what they cannot read, saying why, with exit status 2") {
  const auto dir = scratch("refusals");
  // An oobleck-gpt checkpoint: no Hugging Face names.
  runtime::gpt_config ours;
  ours.blocks = 1;
  std::vector<std::vector<std::byte>> layers;
  {
    runtime::layer_store store(ours);
    store.ensure(0, ours.num_layers());
    for (int l = 0; l < ours.num_layers(); ++l) layers.push_back(store.serialize_layer(l));
  }
  const auto checkpoint = write_checkpoint(dir / "ours", ours, layers).string();
  auto r = testing::run_process(apps_dir + "/oobleck-export", {"--checkpoint", checkpoint, "--out", (dir / "hf").string()});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("the model is oobleck-gpt, which has no Hugging Face names") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "hf"));

  const auto tokens = token_file(dir, 256, 5 * 32 + 1);  // 5 windows of the default 32 tokens
  CHECK(oobleck_eval({"--checkpoint", checkpoint}, tokens, 5) > 0);  // an oobleck-gpt checkpoint evaluates
  r = testing::run_process(apps_dir + "/oobleck-eval", {"--checkpoint", checkpoint, "--tokens", tokens, "--windows", "6"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("--windows 6: " + tokens + " holds only 5 windows of 32 tokens") != std::string::npos);
  r = testing::run_process(apps_dir + "/oobleck-eval", {"--tokens", tokens, "--windows", "1"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("give --checkpoint DIR/step-N or --model OUTDIR") != std::string::npos);
  r = testing::run_process(apps_dir + "/oobleck-eval",
                           {"--checkpoint", checkpoint, "--tokens", tokens, "--windows", "1", "--dtype", "int8"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("--dtype") != std::string::npos);

  // Ids beyond the vocabulary: named with their offset.
  const auto big = (dir / "big.bin").string();
  std::ofstream(big, std::ios::binary) << std::string(64, '\0') << '\x2c' << '\x01' << std::string(64, '\0');
  r = testing::run_process(apps_dir + "/oobleck-eval", {"--checkpoint", checkpoint, "--tokens", big, "--windows", "1"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("token id 300 at byte offset 64 is >= model vocab 256") != std::string::npos);

  // A checkpoint read as another model: its layer files name the model they are of.
  const auto other = (dir / "other.toml").string();
  std::ofstream(other) << "[model]\nblocks = 1\nd_model = 32\n";
  r = testing::run_process(apps_dir + "/oobleck-eval",
                           {"--checkpoint", checkpoint, "--config", other, "--tokens", tokens, "--windows", "1"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("layer 0") != std::string::npos);
  fs::remove(fs::path(checkpoint) / apps::checkpoint_model_file);
  r = testing::run_process(apps_dir + "/oobleck-export", {"--checkpoint", checkpoint, "--out", (dir / "hf").string()});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("give its job with --config") != std::string::npos);
  // A Hugging Face folder that is not one.
  fs::create_directories(dir / "empty");
  r = testing::run_process(apps_dir + "/oobleck-eval", {"--model", (dir / "empty").string(), "--tokens", tokens, "--windows", "1"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("config.json") != std::string::npos);
  CHECK(testing::run_process(apps_dir + "/oobleck-export", {"--help"}).exit_status == 0);
  CHECK(testing::run_process(apps_dir + "/oobleck-eval", {"--help"}).out.find("--windows") != std::string::npos);
  fs::remove_all(dir);
}
