#include "apps/weights_command.hpp"

#include <filesystem>
#include <fstream>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/checkpoint_model.hpp"
#include "apps/flags.hpp"
#include "apps/job_file.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/device.hpp"
#include "runtime/evaluate.hpp"
#include "runtime/hf_gpt2.hpp"
#include "runtime/hf_gpt2_weights.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::apps {

namespace fs = std::filesystem;
using messages::input_error;

namespace {

constexpr const char* kCheckpointHelp =
    "a checkpoint: a step-N folder a job wrote (its model is read from the model.toml beside the manifest, "
    "or from --config for checkpoints written before it existed)";

/// The model of a checkpoint: --config's [model] when given, else the checkpoint's model.toml.
runtime::gpt_config checkpoint_model(const std::string& dir, const std::string& config) {
  runtime::gpt_config model;
  if (!config.empty()) {
    model = read_job_file(config).model;
  } else {
    const auto path = fs::path(dir) / checkpoint_model_file;
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw input_error("--checkpoint: " + path.string() +
                        ": no such file (a checkpoint written before model.toml existed: give its job with --config)");
    std::ostringstream text;
    text << in.rdbuf();
    model = parse_job(text.str(), path.string()).model;
  }
  model.init.clear();  // the checkpoint's values replace any initialisation
  return model;
}

/// Every layer of the checkpoint in `dir`, checked against its manifest (sizes, SHA-256) and the
/// model (each layer file names the model's hash).
std::unique_ptr<runtime::layer_store> load_checkpoint(const std::string& dir, const runtime::gpt_config& model) {
  runtime::checkpoint_manifest m;
  try {
    m = runtime::read_manifest(dir);
  } catch (const runtime::checkpoint_error& e) {
    throw input_error(std::string("--checkpoint: ") + e.what());
  }
  if (m.num_layers != model.num_layers())
    throw input_error("--checkpoint: " + dir + " holds " + std::to_string(m.num_layers) + " layers; the model has " +
                      std::to_string(model.num_layers()));
  auto store = std::make_unique<runtime::layer_store>(model);
  for (int l = 0; l < model.num_layers(); ++l) {
    try {
      const auto bytes = runtime::read_layer_file(dir, runtime::file_of(m, l));
      store->install_layer(l, bytes);
    } catch (const runtime::checkpoint_error& e) {
      throw input_error(std::string("--checkpoint: ") + e.what());
    } catch (const runtime::layer_install_error& e) {
      throw input_error("--checkpoint: " + dir + ": layer " + std::to_string(l) + ": " + e.what());
    }
  }
  return store;
}

constexpr const char* kExportAbout = R"(Writes a checkpoint's model in Hugging Face GPT-2 form: OUTDIR/model.safetensors (F32, the
names and layouts of transformers' GPT2LMHeadModel: transformer.wte.weight, transformer.wpe.weight,
transformer.h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj weights (Conv1D layout,
[in, out]) and biases, transformer.ln_f, and lm_head.weight only when the head is not tied) and
OUTDIR/config.json (GPT2Config). Only architecture "gpt2" has these names; a checkpoint of an
oobleck-gpt model is refused. The optimizer state stays in the checkpoint.

Exit status: 0 written, 2 bad input (flags, a checkpoint that is torn or not of this model, an
oobleck-gpt model), 1 an internal failure.)";

constexpr const char* kEvalAbout = R"(Prints the mean loss of a model over the first W windows of a token file: window i has inputs
tokens[i*T, (i+1)*T) and targets tokens[i*T+1, (i+1)*T+1) (T = the model's seq_len), and the loss
is the mean over windows of each window's mean token cross-entropy, in eval mode (no dropout). The
same definition as the held-out evaluation of a job's [eval]. The model is a checkpoint
(--checkpoint) or a Hugging Face GPT-2 folder with model.safetensors and config.json (--model:
what oobleck-export writes, or any GPT-2 checkpoint of that form).

Exit status: 0 printed, 2 bad input (flags, a model or token file that cannot be read, ids >= the
model's vocabulary, fewer than W windows), 1 an internal failure.)";

}  // namespace

int run_export_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return exit_status_of(err, [&] {
    std::string checkpoint, out_dir, config;
    CLI::App app{"", "oobleck-export"};
    app.footer(kExportAbout);
    add_text(app, "--checkpoint", checkpoint, kCheckpointHelp)->required()->type_name("DIR/step-N");
    add_text(app, "--out", out_dir, "the folder to write model.safetensors and config.json into (created)")
        ->required()
        ->type_name("OUTDIR");
    add_text(app, "--config", config, "the checkpoint's job file, instead of its model.toml")->type_name("JOB.toml");
    if (!parse_flags(app, args, out)) return 0;
    const auto model = checkpoint_model(checkpoint, config);
    if (model.architecture != runtime::model_architecture::gpt2)
      throw input_error("--checkpoint: the model is " + runtime::architecture_name(model.architecture) +
                        ", which has no Hugging Face names; only architecture \"gpt2\" can be exported");
    runtime::use_one_compute_thread();
    const auto store = load_checkpoint(checkpoint, model);
    runtime::export_hf(*store, out_dir);
    err << "wrote " << (fs::path(out_dir) / "model.safetensors").string() << " and config.json (" << model.blocks
        << " blocks, d_model " << model.d_model << ", vocab " << model.vocab
        << (runtime::tied(model) ? ", tied embeddings" : "") << ")\n";
    return 0;
  });
}

int run_eval_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return exit_status_of(err, [&] {
    std::string checkpoint, model_dir, config, tokens, dtype = "uint16";
    std::int64_t windows = 0, batch = 8;
    bool json = false;
    CLI::App app{"", "oobleck-eval"};
    app.footer(kEvalAbout);
    auto* c = add_text(app, "--checkpoint", checkpoint, kCheckpointHelp)->type_name("DIR/step-N");
    auto* m = add_text(app, "--model", model_dir, "a Hugging Face GPT-2 folder (model.safetensors, config.json)")
                  ->type_name("OUTDIR");
    c->excludes(m);
    auto* j = add_text(app, "--config", config, "with --checkpoint: its job file, instead of its model.toml")->type_name("JOB.toml");
    j->needs(c);
    add_text(app, "--tokens", tokens, "the token file: flat little-endian ids of --dtype")->required()->type_name("FILE");
    add_text(app, "--dtype", dtype, "uint16 (default) or uint32")->type_name("uint16|uint32");
    add_integer(app, "--windows", windows, 1, std::int64_t{1} << 40, "how many windows, from the file's start")
        ->required()
        ->type_name("W");
    add_integer(app, "--batch", batch, 1, 1 << 16, "windows per forward (default 8; the loss does not depend on it)")->type_name("B");
    app.add_flag("--json", json, "print one JSON object {\"loss\": L, \"windows\": W}");
    if (!parse_flags(app, args, out)) return 0;
    if (checkpoint.empty() && model_dir.empty()) throw input_error("give --checkpoint DIR/step-N or --model OUTDIR");
    runtime::token_dtype type{};
    try {
      type = runtime::parse_dtype(dtype);
    } catch (const std::invalid_argument& e) {
      throw input_error(std::string("--dtype: ") + e.what());
    }
    runtime::use_one_compute_thread();
    std::unique_ptr<runtime::layer_store> store;
    if (!checkpoint.empty()) {
      store = load_checkpoint(checkpoint, checkpoint_model(checkpoint, config));
    } else {
      runtime::gpt_config model;
      try {
        model = runtime::config_from_hf((fs::path(model_dir) / "config.json").string());
      } catch (const std::invalid_argument& e) {
        throw input_error(std::string("--model: ") + e.what());
      }
      model.init = model_dir;
      store = std::make_unique<runtime::layer_store>(model);
      try {
        store->ensure(0, model.num_layers());
      } catch (const std::invalid_argument& e) {
        throw input_error(std::string("--model: ") + e.what());
      }
    }
    const auto& model = store->model();
    std::optional<runtime::token_dataset> data;
    try {
      data.emplace(runtime::make_dataset(runtime::data_source::token_file(tokens, type), model.seq_len, model.vocab));
    } catch (const std::runtime_error& e) {
      throw input_error(std::string("--tokens: ") + e.what());
    }
    if (windows > data->size())
      throw input_error("--windows " + std::to_string(windows) + ": " + tokens + " holds only " +
                        std::to_string(data->size()) + " windows of " + std::to_string(model.seq_len) + " tokens");
    const double loss = runtime::evaluate(*store, *data, windows, batch);
    if (json) {
      out << nlohmann::json{{"loss", loss}, {"windows", windows}}.dump() << "\n";
    } else {
      char text[64];
      std::snprintf(text, sizeof text, "%.9g", loss);
      out << "loss " << text << " over " << windows << " windows of " << model.seq_len << " tokens\n";
    }
    return 0;
  });
}

}  // namespace oobleck::apps
