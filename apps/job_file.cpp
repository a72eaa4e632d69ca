#include "apps/job_file.hpp"

#include <toml++/toml.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "apps/job_schema.hpp"
#include "messages/input_error.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/hf_gpt2.hpp"

namespace oobleck::apps {

using messages::input_error;

namespace {

using namespace job_file_detail;

/// [model] preset fills the model's keys before any is read: toml++ walks a table in key order,
/// not in the file's, and the keys written beside the preset must win whatever their names.
void apply_model_preset(const decoder& d, const toml::table& root, job_file& job) {
  const toml::node* at = root.at_path("model.preset").node();
  if (at == nullptr) return;
  const std::string name = d.text(*at, "model.preset");
  if (name.empty()) return;  // the default: no preset
  try {
    job.model = runtime::preset(name);
  } catch (const std::invalid_argument& e) {
    d.fail(*at, std::string("model.preset: ") + e.what());
  }
}

/// The [model] rules that depend on which keys the file sets: a preset is a gpt2 model, and gpt2
/// ties its embeddings unless the file says otherwise.
void finish_model(const decoder& d, const toml::table& root, job_file& job) {
  using runtime::model_architecture;
  const toml::node* preset = root.at_path("model.preset").node();
  const toml::node* architecture = root.at_path("model.architecture").node();
  const toml::node* tie = root.at_path("model.tie_embeddings").node();
  if (preset != nullptr && !preset->value_or(std::string()).empty() &&
      job.model.architecture != model_architecture::gpt2)
    d.fail(architecture != nullptr ? *architecture : *preset,
           "model.architecture \"" + runtime::architecture_name(job.model.architecture) + "\" contradicts model.preset \"" +
               preset->value_or(std::string()) + "\", a gpt2 model");
  if (job.model.architecture == model_architecture::gpt2 && tie == nullptr) job.model.tie_embeddings = true;
  if (job.model.tie_embeddings && job.model.architecture != model_architecture::gpt2)
    d.fail(*tie, "model.tie_embeddings = true needs model.architecture = \"gpt2\" (oobleck-gpt's LM head is a "
                 "matrix of its own)");
}

/// [data] and [eval]: one training source, keys that belong to it, a vocabulary that holds
/// byte-level ids, and a validation file for evaluation. (What needs the files is read_job_file's.)
void check_data_rules(const decoder& d, const job_file& job) {
  const auto& data = job.data;
  if (!data.train.empty() && !data.text.empty())
    d.fail_rule({"data.text", "data.train"}, "data.text and data.train are exclusive: train on a text file (byte-level) "
                                             "or on a token file, not both");
  for (const char* key : {"data.corpus_bytes", "data.corpus_seed"})
    if (!data.train.empty() || !data.text.empty())
      if (const toml::node* at = d.root().at_path(key).node())
        d.fail(*at, std::string(key) + " applies to the generated corpus only, not to data." +
                        (data.train.empty() ? "text" : "train"));
  if (!data.text.empty())
    if (const toml::node* at = d.root().at_path("data.dtype").node())
      d.fail(*at, "data.dtype applies to token files (data.train); data.text is read byte-level");
  if (data.train.empty() && job.model.vocab < kByteVocab)
    d.fail_rule({"model.vocab", "model.preset"},
                "model.vocab must be >= 256 with byte-level data (" +
                    (data.text.empty() ? std::string("the generated corpus") : "data.text") +
                    " has token ids 0..255), got " + std::to_string(job.model.vocab));
  if (job.eval.every > 0 && data.validation.empty())
    d.fail_rule({"eval.every"}, "eval.every needs data.validation (the held-out token file it evaluates on)");
}

/// The rules that tie keys together, checked once every key is read.
void check_rules(const decoder& d, const job_file& job) {
  try {
    runtime::validate(job.model);
  } catch (const std::invalid_argument& e) {
    d.fail(e.what());
  }
  const auto& t = job.training;
  if (t.global_batch % t.microbatch != 0)
    d.fail_rule({"training.global_batch", "training.microbatch"},
                "training.global_batch " + std::to_string(t.global_batch) +
                    " is not a multiple of training.microbatch " + std::to_string(t.microbatch));
  check_data_rules(d, job);
  if (job.data.train.empty() && job.data.text.empty() && job.data.corpus_bytes < job.model.seq_len + 1)
    d.fail_rule({"data.corpus_bytes", "model.seq_len"},
                "data.corpus_bytes " + std::to_string(job.data.corpus_bytes) +
                    " holds no sample: it must be >= model.seq_len + 1 = " + std::to_string(job.model.seq_len + 1));
  const auto& lr = job.optimizer.lr;
  if (lr.min_lr > lr.peak)
    d.fail_rule({"optimizer.min_lr", "optimizer.lr"},
                "optimizer.min_lr " + format(lr.min_lr) + " is above optimizer.lr " + format(lr.peak));
  const auto& c = job.cluster;
  if (c.nodes < c.fault_tolerance + 1)
    d.fail_rule({"cluster.nodes", "cluster.fault_tolerance"},
                "cluster.nodes " + std::to_string(c.nodes) + " cannot hold cluster.fault_tolerance + 1 = " +
                    std::to_string(c.fault_tolerance + 1) + " pipelines");
  if (c.device == "cuda" && c.slots_per_node > 1)
    d.fail_rule({"cluster.device", "cluster.slots_per_node"},
                "cluster.device \"cuda\" runs one GPU per worker process: cluster.slots_per_node must be 1, got " +
                    std::to_string(c.slots_per_node) + " (nodes of several GPUs as one worker are not built yet)");
  if (c.data_plane == "nccl" && c.device != "cuda")
    d.fail_rule({"cluster.data_plane", "cluster.device"},
                "cluster.data_plane \"nccl\" carries tensors between GPUs: cluster.device must be \"cuda\", got \"" +
                    c.device + "\"");
  if (c.connection_timeout_ms < 2LL * c.heartbeat_interval_ms)
    d.fail_rule({"cluster.connection_timeout_ms", "cluster.heartbeat_interval_ms"},
                "cluster.connection_timeout_ms " + std::to_string(c.connection_timeout_ms) +
                    " must be >= 2 * cluster.heartbeat_interval_ms = " + std::to_string(2LL * c.heartbeat_interval_ms) +
                    " (one late heartbeat must not lose a node)");
  if (job.checkpoint.every > 0 && job.checkpoint.dir.empty())
    d.fail_rule({"checkpoint.every"}, "checkpoint.every needs checkpoint.dir");
  const auto& tls = job.tls;
  if (tls.enabled() || !tls.passphrase.empty()) {
    // Half a TLS configuration would either fail at the first connection or, worse, run in the clear.
    const std::pair<const char*, const std::string*> parts[] = {
        {"tls.certificate", &tls.certificate}, {"tls.key", &tls.key}, {"tls.ca_file", &tls.ca_file}};
    std::vector<std::string> unset;
    for (const auto& [key, value] : parts)
      if (value->empty()) unset.emplace_back(key);
    std::string missing;
    for (std::size_t i = 0; i < unset.size(); ++i)
      missing += (i == 0 ? "" : i + 1 == unset.size() ? " and " : ", ") + unset[i];
    if (!missing.empty())
      d.fail_rule({"tls.certificate", "tls.key", "tls.ca_file", "tls.passphrase"},
                  "[tls] needs tls.certificate, tls.key and tls.ca_file together: " + missing + " not set");
  }
}

/// What needs the files (read_job_file, once paths are resolved): the data files hold whole token
/// ids and at least one sample (the validation file eval.windows windows), and model.init agrees
/// with [model].
void check_files(const job_file& job, const std::string& origin) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw input_error(origin + ": " + key + ": " + what);
  };
  const auto seq_len = job.model.seq_len;
  const std::pair<const char*, runtime::data_source> sources[] = {
      {job.data.train.empty() ? "data.text" : "data.train", job.data.train_source()},
      {"data.validation", job.data.validation_source()}};
  for (const auto& [key, source] : sources) {
    if (source.kind != runtime::data_source::kind_t::text && source.kind != runtime::data_source::kind_t::tokens)
      continue;
    std::int64_t tokens = 0;
    try {
      tokens = runtime::token_count(source);
    } catch (const std::exception& e) {
      fail(key, e.what());
    }
    const auto windows = runtime::windows_in(tokens, seq_len);
    if (windows < 1)
      fail(key, source.path + " holds " + std::to_string(tokens) + " token(s), fewer than one sample of model.seq_len + 1 = " +
                    std::to_string(seq_len + 1));
    if (std::string(key) == "data.validation" && job.eval.every > 0 && windows < job.eval.windows)
      fail("eval.windows", std::to_string(job.eval.windows) + " windows of " + std::to_string(seq_len) +
                               " tokens do not fit data.validation " + source.path + ": it holds " +
                               std::to_string(windows));
  }
  if (!job.model.init.empty()) {
    try {
      runtime::check_hf_config(job.model, job.model.init);
    } catch (const std::invalid_argument& e) {
      fail("model.init", e.what());
    }
    try {
      runtime::check_hf_weights(job.model, job.model.init);
    } catch (const std::invalid_argument& e) {
      fail("model.init", e.what());
    }
  }
}

}  // namespace

runtime::data_source data_section::train_source() const {
  if (!train.empty()) return runtime::data_source::token_file(train, dtype);
  if (!text.empty()) return runtime::data_source::text_file(text);
  return runtime::data_source::generated(corpus_bytes, corpus_seed);
}

runtime::data_source data_section::validation_source() const {
  runtime::data_source s;
  if (validation.empty()) s.kind = runtime::data_source::kind_t::none;
  else if (!text.empty()) s = runtime::data_source::text_file(validation);
  else s = runtime::data_source::token_file(validation, dtype);
  return s;
}

job_file parse_job(std::string_view text, std::string_view origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw input_error(std::string(origin) + ":" + std::to_string(e.source().begin.line) + ": " +
                      std::string(e.description()));
  }
  const decoder d(origin, root);
  job_file job;
  const auto keys = schema(job);
  apply_model_preset(d, root, job);
  for (const auto& [section_key, section] : root) {
    const std::string name(section_key.str());
    const auto* table = section.as_table();
    if (!table) {
      const auto next = keys.lower_bound(name + ".");
      const bool is_section = next != keys.end() && next->first.rfind(name + ".", 0) == 0;
      d.fail(section, is_section ? name + ": expected a table [" + name + "]" : "unknown key " + name);
    }
    for (const auto& [key, value] : *table) {
      const std::string path = name + "." + std::string(key.str());
      const auto it = keys.find(path);
      if (it == keys.end()) d.fail(value, "unknown key " + path);
      it->second(d, value, path);
    }
  }
  job.optimizer.lr.total_steps = job.training.steps;
  finish_model(d, root, job);
  check_rules(d, job);
  return job;
}

std::string read_job_text(const std::string& path) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw input_error("cannot read job file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  // fopen succeeds on a directory; reading it is the error.
  if (std::ferror(f.get())) throw input_error("cannot read job file " + path + ": " + std::strerror(errno));
  return text;
}

job_file read_job_file(const std::string& path) {
  job_file job = parse_job(read_job_text(path), path);
  const auto folder = std::filesystem::path(path).parent_path();
  for (std::string* p : {&job.profile.file, &job.profile.cache, &job.checkpoint.dir, &job.tls.certificate, &job.tls.key, &job.tls.ca_file,
                         &job.data.train, &job.data.text, &job.data.validation, &job.model.init})
    if (!p->empty() && std::filesystem::path(*p).is_relative()) *p = (folder / *p).string();
  check_files(job, path);
  return job;
}

namespace {

toml::table parse_job_table(std::string_view text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw input_error(path + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
}

/// Makes the job's relative data paths absolute (relative to `path`'s folder); true if any was.
bool resolve_paths(toml::table& root, const std::string& path) {
  const auto folder = std::filesystem::absolute(std::filesystem::path(path)).parent_path();
  bool changed = false;
  for (const char* key : {"data.train", "data.text", "data.validation", "model.init"}) {
    auto* value = root.at_path(key).as_string();
    if (value == nullptr || value->get().empty() || std::filesystem::path(value->get()).is_absolute()) continue;
    *value = (folder / value->get()).lexically_normal().string();
    changed = true;
  }
  return changed;
}

std::string text_of(const toml::table& root) {
  std::ostringstream out;
  out << toml::toml_formatter(root) << "\n";
  return out.str();
}

}  // namespace

std::string job_text_for_workers(std::string_view text, const std::string& path) {
  auto root = parse_job_table(text, path);
  if (!resolve_paths(root, path)) return std::string(text);
  return text_of(root);
}

void check_device_built(const job_file& job) {
  if (job.cluster.device == "cuda" && !runtime::built_with_cuda())
    throw input_error("cluster.device \"cuda\": " + runtime::no_cuda_build_reason());
  if (job.cluster.data_plane == "nccl" && !runtime::built_with_cuda())
    throw input_error("cluster.data_plane \"nccl\": " + runtime::no_cuda_build_reason());
}

std::string job_text_on_device(std::string_view text, const std::string& path, const std::string& device) {
  auto root = parse_job_table(text, path);
  resolve_paths(root, path);
  auto* cluster = root["cluster"].as_table();
  if (cluster == nullptr) {
    root.insert("cluster", toml::table{});
    cluster = root["cluster"].as_table();
  }
  cluster->insert_or_assign("device", device);
  return text_of(root);
}

planning::synthetic_gpt synthetic_model(const job_file& job) {
  auto narrow = [](std::int64_t x, const char* key) {
    if (x > INT_MAX)
      throw input_error(std::string(key) + " " + std::to_string(x) + " is too large for a synthetic profile");
    return static_cast<int>(x);
  };
  return {.layers = narrow(job.model.blocks + 2, "model.blocks"),
          .hidden = narrow(job.model.d_model, "model.d_model"),
          .heads = narrow(job.model.heads, "model.heads"),
          .sequence = narrow(job.model.seq_len, "model.seq_len"),
          .vocab = narrow(job.model.vocab, "model.vocab"),
          .microbatch = job.training.microbatch,
          .gpus_per_node = job.cluster.slots_per_node,
          .device_tflops = 0.02,
          .device_memory_bytes = job.cluster.device_memory_bytes};
}

planning::profile modelled_profile(const job_file& job) {
  auto p = planning::synthetic_gpt_profile(synthetic_model(job));
  p.config_hash = job.model.hash();
  return p;
}

planning::job_config planner_job(const job_file& job, int nodes, int fault_tolerance) {
  planning::job_config c;
  c.nodes = nodes;
  c.fault_tolerance = fault_tolerance;
  c.global_batch = job.training.global_batch;
  c.microbatch = job.training.microbatch;
  c.device_memory_bytes = job.cluster.device_memory_bytes;
  return c;
}

}  // namespace oobleck::apps
