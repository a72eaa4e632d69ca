// The job file's data sources, initial weights, device and precision (the rest: job_file_test.cpp).
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/job_file_text.hpp"
#include "messages/input_error.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/hf_gpt2.hpp"
#include "runtime/safetensors.hpp"

using namespace oobleck;
using testing::error_of;
using testing::kSource;
using testing::read_text;

namespace {

/// A scratch folder with a job file of `text` in it; removed at the end of the test.
struct job_folder {
  std::filesystem::path dir;
  explicit job_folder(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("oobleck-job-data-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~job_folder() { std::filesystem::remove_all(dir); }
  std::string job(const std::string& text) const {
    const auto path = (dir / "job.toml").string();
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }
  void file(const std::string& name, std::size_t bytes) const {
    std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << std::string(bytes, '\0');
  }
  std::string error_of(const std::string& text) const {
    try {
      apps::read_job_file(job(text));
    } catch (const messages::input_error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE("[data]: the generated corpus by default, a token file or a text file, exclusive, and keys of one source only") {
  const auto def = apps::parse_job("");
  CHECK(def.data.train_source() == runtime::data_source::generated(1 << 20, 7));
  CHECK(def.data.validation_source().empty());
  CHECK(def.eval.every == 0);
  CHECK(def.eval.windows == 16);

  const auto tokens = apps::parse_job("[model]\nvocab = 50257\n[data]\ntrain = \"t.bin\"\ndtype = \"uint32\"\nvalidation = \"v.bin\"\n");
  CHECK(tokens.data.train_source() == runtime::data_source::token_file("t.bin", runtime::token_dtype::uint32));
  CHECK(tokens.data.validation_source() == runtime::data_source::token_file("v.bin", runtime::token_dtype::uint32));
  const auto text = apps::parse_job("[data]\ntext = \"a.txt\"\nvalidation = \"b.txt\"\n");
  CHECK(text.data.train_source() == runtime::data_source::text_file("a.txt"));
  CHECK(text.data.validation_source() == runtime::data_source::text_file("b.txt"));

  CHECK(error_of("[data]\ntrain = \"t.bin\"\ntext = \"a.txt\"\n") ==
        "job.toml:3: data.text and data.train are exclusive: train on a text file (byte-level) or on a token file, not both");
  CHECK(error_of("[data]\ndtype = \"int8\"\n") == "job.toml:2: data.dtype must be \"uint16\" or \"uint32\", got \"int8\"");
  CHECK(error_of("[data]\ntrain = \"t.bin\"\ncorpus_bytes = 100\n") ==
        "job.toml:3: data.corpus_bytes applies to the generated corpus only, not to data.train");
  CHECK(error_of("[data]\ntext = \"a.txt\"\ndtype = \"uint32\"\n") ==
        "job.toml:3: data.dtype applies to token files (data.train); data.text is read byte-level");
  // vocab >= 256 is a rule of byte-level data only.
  CHECK(error_of("[model]\nvocab = 100\n[data]\ntrain = \"t.bin\"\n").empty());
  CHECK(error_of("[model]\nvocab = 100\n[data]\ntext = \"a.txt\"\n") ==
        "job.toml:2: model.vocab must be >= 256 with byte-level data (data.text has token ids 0..255), got 100");
  CHECK(error_of("[eval]\nevery = 10\n") ==
        "job.toml:2: eval.every needs data.validation (the held-out token file it evaluates on)");
  CHECK(error_of("[eval]\nwindows = 0\n") == "job.toml:2: eval.windows must be >= 1, got 0");
}

TEST_CASE("read_job_file: data files are relative to the job's folder, whole ids, at least a sample, and windows that fit") {
  const job_folder f("files");
  f.file("train.bin", 2 * 1000);
  f.file("val.bin", 2 * 65);  // 65 ids: 4 windows of 16
  auto job = apps::read_job_file(f.job("[model]\nseq_len = 16\n[data]\ntrain = \"train.bin\"\nvalidation = \"val.bin\"\n"
                                       "[eval]\nevery = 5\nwindows = 4\n"));
  CHECK(job.data.train == (f.dir / "train.bin").string());
  CHECK(job.data.validation == (f.dir / "val.bin").string());
  const auto origin = (f.dir / "job.toml").string();
  CHECK(f.error_of("[model]\nseq_len = 16\n[data]\ntrain = \"train.bin\"\nvalidation = \"val.bin\"\n[eval]\nevery = 5\nwindows = 5\n") ==
        origin + ": eval.windows: 5 windows of 16 tokens do not fit data.validation " + (f.dir / "val.bin").string() +
            ": it holds 4");
  f.file("odd.bin", 2001);
  CHECK(f.error_of("[data]\ntrain = \"odd.bin\"\n") ==
        origin + ": data.train: " + (f.dir / "odd.bin").string() +
            ": 2001 bytes is not a whole number of uint16 token ids (2 bytes each)");
  CHECK(f.error_of("[data]\ntrain = \"missing.bin\"\n").find(origin + ": data.train: " + (f.dir / "missing.bin").string()) == 0);
  CHECK(f.error_of("[model]\nseq_len = 1000\n[data]\ntrain = \"train.bin\"\n") ==
        origin + ": data.train: " + (f.dir / "train.bin").string() +
            " holds 1000 token(s), fewer than one sample of model.seq_len + 1 = 1001");
  CHECK(f.error_of("[data]\ntext = \"train.bin\"\n").empty());  // 2000 bytes of text
}

TEST_CASE("model.init: config.json and the tensors are checked against [model] when the job file is read") {
  const job_folder f("init");
  std::filesystem::create_directories(f.dir / "hf");
  std::ofstream(f.dir / "hf" / "config.json") << R"({"model_type": "gpt2", "vocab_size": 300, "n_positions": 16,
    "n_embd": 24, "n_layer": 1, "n_head": 2, "layer_norm_epsilon": 1e-05, "tie_word_embeddings": true})";
  const std::string model = "[model]\narchitecture = \"gpt2\"\nvocab = 300\nseq_len = 16\nheads = 2\nblocks = 1\n";
  const auto origin = (f.dir / "job.toml").string();
  const auto weights = (f.dir / "hf" / "model.safetensors").string();
  CHECK(f.error_of(model + "d_model = 16\ninit = \"hf\"\n") ==
        origin + ": model.init: config.json n_embd 24 disagrees with [model] d_model 16");
  CHECK(f.error_of(model + "d_model = 24\ninit = \"hf\"\n").find(origin + ": model.init: " + weights + ": cannot read") == 0);
  // Every tensor of GPT-2's names, one of them in the wrong (our) layout.
  auto c = apps::parse_job(model + "d_model = 24\n").model;
  std::vector<std::vector<float>> values;
  values.reserve(64);  // the tensors' spans point into it
  std::vector<runtime::safetensors_tensor> tensors;
  for (int l = 0; l < c.num_layers(); ++l)
    for (const auto& p : runtime::hf_parameters(c, l)) {
      if (l == c.num_layers() - 1 && p.name == "transformer.wte.weight") continue;  // tied: once
      auto shape = p.shape;
      if (p.transposed && p.name != "transformer.h.0.mlp.c_fc.weight") std::swap(shape[0], shape[1]);
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      values.emplace_back(static_cast<std::size_t>(n), 0.5f);
      tensors.push_back({p.name, shape, values.back()});
    }
  runtime::write_safetensors(weights, tensors, {{"format", "pt"}});
  CHECK(f.error_of(model + "d_model = 24\ninit = \"hf\"\n") ==
        origin + ": model.init: " + weights + ": tensor transformer.h.0.mlp.c_fc.weight has shape [96, 24], the model needs [24, 96]");
  tensors.erase(tensors.begin() + 2);  // transformer.h.0.ln_1.weight
  for (auto& t : tensors)
    if (t.name == "transformer.h.0.mlp.c_fc.weight") std::swap(t.shape[0], t.shape[1]);  // right again
  runtime::write_safetensors(weights, tensors, {{"format", "pt"}});
  CHECK(f.error_of(model + "d_model = 24\ninit = \"hf\"\n") ==
        origin + ": model.init: " + weights + ": no tensor transformer.h.0.ln_1.weight");
  tensors.insert(tensors.begin() + 2, {"transformer.h.0.ln_1.weight", {24}, values[2]});
  runtime::write_safetensors(weights, tensors, {{"format", "pt"}});
  const auto job = apps::read_job_file(f.job(model + "d_model = 24\ninit = \"hf\"\n"));
  CHECK(job.model.init == (f.dir / "hf").string());
  CHECK(job.model.hash() == apps::parse_job(model + "d_model = 24\n").model.hash());  // init is not the shapes
  CHECK(f.error_of(model + "d_model = 24\ntie_embeddings = false\ninit = \"hf\"\n") ==
        origin + ": model.init: config.json tie_word_embeddings true disagrees with [model] tie_embeddings false");
  CHECK(f.error_of("[model]\ninit = \"hf\"\n") ==
        origin + ": model.init: needs [model] architecture = \"gpt2\" (the folder holds Hugging Face GPT-2 weights), not "
                 "\"oobleck-gpt\"");
}

TEST_CASE("the job text workers receive has its relative data paths and model.init made absolute") {
  const job_folder f("workers");
  const std::string text = "[model]\nvocab = 300\n\n[data]\ntrain = \"data/train.bin\"\nvalidation = \"/abs/val.bin\"\n"
                           "[optimizer]\nlr = 0.1\n";
  const auto path = f.job(text);
  const auto sent = apps::job_text_for_workers(text, path);
  const auto job = apps::parse_job(sent, "sent");
  CHECK(job.data.train == (f.dir / "data/train.bin").string());
  CHECK(job.data.validation == "/abs/val.bin");
  CHECK(job.optimizer.lr.peak == 0.1);
  auto expected = apps::parse_job(text);
  expected.data.train = job.data.train;
  CHECK(job == expected);  // nothing else changed
  const std::string plain = "[model]\nvocab = 300\n";
  CHECK(apps::job_text_for_workers(plain, path) == plain);  // nothing to resolve: the same text
  // A relative job path resolves against the current directory, as the coordinator reads it.
  CHECK(apps::parse_job(apps::job_text_for_workers(text, "job.toml")).data.train ==
        (std::filesystem::current_path() / "data/train.bin").string());
}

TEST_CASE("cluster.device: cpu by default, cuda with one GPU per worker, anything else refused") {
  CHECK(apps::parse_job("").cluster.device == "cpu");
  CHECK(apps::parse_job("[cluster]\ndevice = \"cuda\"\n").cluster.device == "cuda");
  CHECK(error_of("[cluster]\ndevice = \"gpu\"\n") == "job.toml:2: cluster.device must be \"cpu\" or \"cuda\", got \"gpu\"");
  CHECK(error_of("[cluster]\ndevice = \"cuda\"\nslots_per_node = 2\n")
            .find("cluster.device \"cuda\" runs one GPU per worker process: cluster.slots_per_node must be 1, got 2") !=
        std::string::npos);
  CHECK(error_of("[cluster]\ndevice = \"cpu\"\nslots_per_node = 2\n").empty());
}

TEST_CASE("cluster.data_plane: the host transport by default, nccl on cuda only, in a build with CUDA") {
  CHECK(apps::parse_job("").cluster.data_plane == "host");
  const auto nccl = apps::parse_job("[cluster]\ndevice = \"cuda\"\ndata_plane = \"nccl\"\n");
  CHECK(nccl.cluster.data_plane == "nccl");
  CHECK(error_of("[cluster]\ndata_plane = \"gloo\"\n") ==
        "job.toml:2: cluster.data_plane must be \"host\" or \"nccl\", got \"gloo\"");
  CHECK(error_of("[cluster]\ndata_plane = \"nccl\"\n")
            .find("cluster.data_plane \"nccl\" carries tensors between GPUs: cluster.device must be \"cuda\", got \"cpu\"") !=
        std::string::npos);
  CHECK(error_of("[cluster]\ndevice = \"cuda\"\ndata_plane = \"host\"\n").empty());
  // The programs refuse what their build cannot run, before anything starts.
  if (runtime::built_with_cuda()) {
    CHECK_NOTHROW(apps::check_device_built(nccl));
  } else {
    auto host_on_cpu = apps::parse_job("");
    CHECK_NOTHROW(apps::check_device_built(host_on_cpu));
    std::string why;
    try {
      auto only_nccl = nccl;
      only_nccl.cluster.device = "cpu";  // past the file's rules: the build's check on its own
      apps::check_device_built(only_nccl);
    } catch (const messages::input_error& e) {
      why = e.what();
    }
    CHECK(why.find("cluster.data_plane \"nccl\": ") == 0);
  }
}

TEST_CASE("cluster.shared_memory: on by default, a boolean, carried to the stages' data plane") {
  CHECK(apps::parse_job("").cluster.shared_memory);
  CHECK(apps::stage_job_for(apps::parse_job("")).shared_memory);
  const auto off = apps::parse_job("[cluster]\nshared_memory = false\n");
  CHECK_FALSE(off.cluster.shared_memory);
  CHECK_FALSE(apps::stage_job_for(off).shared_memory);
  CHECK(error_of("[cluster]\nshared_memory = \"yes\"\n") == "job.toml:2: cluster.shared_memory must be true or false");
}

TEST_CASE("cluster.spin_wait_us: 1000 by default, 0 to 1,000,000, carried to the stages' data plane") {
  CHECK(apps::parse_job("").cluster.spin_wait_us == 1000);
  CHECK(apps::stage_job_for(apps::parse_job("")).spin_wait_us == 1000);
  const auto off = apps::parse_job("[cluster]\nspin_wait_us = 0\n");
  CHECK(off.cluster.spin_wait_us == 0);
  CHECK(apps::stage_job_for(off).spin_wait_us == 0);
  CHECK(error_of("[cluster]\nspin_wait_us = -1\n").find("cluster.spin_wait_us") != std::string::npos);
  CHECK(error_of("[cluster]\nspin_wait_us = \"long\"\n").find("cluster.spin_wait_us") != std::string::npos);
}

TEST_CASE("training.precision: fp32 by default, bf16 into the model's precision, outside the model hash") {
  const auto fp32 = apps::parse_job("");
  CHECK(fp32.model.precision == runtime::precision_kind::fp32);
  const auto bf16 = apps::parse_job("[training]\nprecision = \"bf16\"\n");
  CHECK(bf16.model.precision == runtime::precision_kind::bf16);
  CHECK(bf16.model.hash() == fp32.model.hash());  // the same layers, bytes and checkpoints
  CHECK(apps::parse_job("[training]\nprecision = \"fp32\"\n").model.precision == runtime::precision_kind::fp32);
  CHECK(error_of("[training]\nprecision = \"fp16\"\n") == "job.toml:2: training.precision must be \"fp32\" or \"bf16\", got \"fp16\"");
  CHECK(error_of("[training]\nprecision = 16\n").find("training.precision") != std::string::npos);
}

TEST_CASE("oobleck-local --device: the job's text with cluster.device set and its paths absolute") {
  const job_folder f("on-device");
  const std::string text = "[data]\ntrain = \"data/train.bin\"\n";
  const auto path = f.job(text);
  const auto job = apps::parse_job(apps::job_text_on_device(text, path, "cuda"), "sent");
  CHECK(job.cluster.device == "cuda");
  CHECK(job.data.train == (f.dir / "data/train.bin").string());
  // An existing [cluster] table keeps its other keys.
  const std::string with_cluster = "[cluster]\nnodes = 4\ndevice = \"cuda\"\n";
  const auto back = apps::parse_job(apps::job_text_on_device(with_cluster, f.job(with_cluster), "cpu"), "sent");
  CHECK(back.cluster.device == "cpu");
  CHECK(back.cluster.nodes == 4);
}

TEST_CASE("the GPT-2 example job is GPT-2 small on token files, and its shrunk laptop form is valid") {
  const std::string text = read_text(kSource / "examples/gpt2/job.toml");
  const auto job = apps::parse_job(text, "examples/gpt2/job.toml");
  CHECK(job.model == runtime::preset("gpt2"));
  CHECK(job.data.train_source() == runtime::data_source::token_file("train.bin"));
  CHECK(job.eval.every > 0);
  // What its comment tells a laptop user to write beside the preset.
  const auto small = apps::parse_job(text.substr(0, text.find("[data]")) + "seq_len = 128\nblocks = 2\nvocab = 256\n" +
                                     text.substr(text.find("[data]")));
  CHECK(small.model.vocab == 256);
  CHECK(small.model.blocks == 2);
  CHECK(small.model.d_model == 768);
}
