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

#include "messages/input_error.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/hf_gpt2.hpp"

namespace oobleck::apps {

using messages::input_error;

namespace {

constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string format(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

/// A range of numbers, each end open or closed; infinite ends are not printed.
struct range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string describe() const {
    if (hi == kInf) return std::string(lo_open ? "> " : ">= ") + format(lo);
    if (lo == -kInf) return std::string(hi_open ? "< " : "<= ") + format(hi);
    return std::string("in ") + (lo_open ? "(" : "[") + format(lo) + ", " + format(hi) + (hi_open ? ")" : "]");
  }
};

class decoder {
 public:
  decoder(std::string_view origin, const toml::table& root) : origin_(origin), root_(root) {}

  [[noreturn]] void fail(const toml::node& at, const std::string& what) const {
    throw input_error(origin_ + ":" + std::to_string(at.source().begin.line) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { throw input_error(origin_ + ": " + what); }

  /// A rule across keys: at the line of the first of `keys` that the file sets.
  [[noreturn]] void fail_rule(std::initializer_list<const char*> keys, const std::string& what) const {
    for (const char* key : keys)
      if (const toml::node* at = root_.at_path(key).node()) fail(*at, what);
    fail(what);
  }

  std::int64_t integer(const toml::node& v, const std::string& key, std::int64_t min, std::int64_t max,
                       const std::string& why = "") const {
    const auto* x = v.as_integer();
    if (!x) fail(v, key + ": expected an integer, got " + type_of(v));
    if (x->get() < min) fail(v, key + " must be >= " + std::to_string(min) + why + ", got " + std::to_string(x->get()));
    if (x->get() > max) fail(v, key + " must be <= " + std::to_string(max) + ", got " + std::to_string(x->get()));
    return x->get();
  }

  /// A float or an integer (TOML's `0` is an integer; a user writing lr = 1 means a number).
  double number(const toml::node& v, const std::string& key, const range& r = {}) const {
    double x = 0;
    if (const auto* f = v.as_floating_point()) x = f->get();
    else if (const auto* i = v.as_integer()) x = static_cast<double>(i->get());
    else fail(v, key + ": expected a number, got " + type_of(v));
    if (!std::isfinite(x)) fail(v, key + " must be finite");
    if (!r.contains(x)) fail(v, key + " must be " + r.describe() + ", got " + format(x));
    return x;
  }

  const toml::table& root() const { return root_; }

  std::string text(const toml::node& v, const std::string& key) const {
    const auto* s = v.as_string();
    if (!s) fail(v, key + ": expected a string, got " + type_of(v));
    return s->get();
  }

 private:
  static std::string type_of(const toml::node& v) {
    std::ostringstream s;
    s << v.type();
    return s.str();
  }

  std::string origin_;
  const toml::table& root_;
};

using setter = std::function<void(const decoder&, const toml::node&, const std::string& key)>;

setter int64_in(std::int64_t& target, std::int64_t min, std::int64_t max = kMax64) {
  return [&target, min, max](const decoder& d, const toml::node& v, const std::string& key) {
    target = d.integer(v, key, min, max);
  };
}
setter uint64_in(std::uint64_t& target, std::int64_t min) {
  return [&target, min](const decoder& d, const toml::node& v, const std::string& key) {
    target = static_cast<std::uint64_t>(d.integer(v, key, min, kMax64));
  };
}
/// An int knob never narrows: 2^32 + 1 is refused, not read as 1.
setter int_in(int& target, int min, int max = INT_MAX) {
  return [&target, min, max](const decoder& d, const toml::node& v, const std::string& key) {
    target = static_cast<int>(d.integer(v, key, min, max));
  };
}
setter number_in(double& target, range r) {
  return [&target, r](const decoder& d, const toml::node& v, const std::string& key) { target = d.number(v, key, r); };
}
setter text_of(std::string& target) {
  return [&target](const decoder& d, const toml::node& v, const std::string& key) { target = d.text(v, key); };
}

/// Every key of the schema, by its path.
std::map<std::string, setter> schema(job_file& job) {
  auto& lr = job.optimizer.lr;
  return {
      {"model.vocab",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         job.model.vocab = d.integer(v, key, 1, kMax64);  // >= 256 with byte-level data: check_rules
       }},
      {"model.d_model", int64_in(job.model.d_model, 1)},
      {"model.heads", int64_in(job.model.heads, 1)},
      {"model.blocks", int64_in(job.model.blocks, 1)},
      {"model.seq_len", int64_in(job.model.seq_len, 1)},
      {"model.dropout", number_in(job.model.dropout, {})},  // its range is runtime::validate's
      {"model.seed", uint64_in(job.model.seed, 0)},
      {"model.architecture",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         if (name == runtime::architecture_name(runtime::model_architecture::oobleck_gpt))
           job.model.architecture = runtime::model_architecture::oobleck_gpt;
         else if (name == runtime::architecture_name(runtime::model_architecture::gpt2))
           job.model.architecture = runtime::model_architecture::gpt2;
         else
           d.fail(v, key + " must be \"oobleck-gpt\" or \"gpt2\", got \"" + name + "\"");
       }},
      // Applied before every other key (apply_model_preset), so that the table's keys override it.
      {"model.preset", [](const decoder& d, const toml::node& v, const std::string& key) { d.text(v, key); }},
      {"model.tie_embeddings",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         if (!v.is_boolean()) d.fail(v, key + " must be true or false");
         job.model.tie_embeddings = v.as_boolean()->get();
       }},

      {"data.corpus_bytes", int64_in(job.data.corpus_bytes, 2, 1LL << 30)},
      {"data.corpus_seed", uint64_in(job.data.corpus_seed, 0)},
      {"data.train", text_of(job.data.train)},
      {"data.text", text_of(job.data.text)},
      {"data.validation", text_of(job.data.validation)},
      {"data.dtype",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         try {
           job.data.dtype = runtime::parse_dtype(name);
         } catch (const std::invalid_argument&) {
           d.fail(v, key + " must be \"uint16\" or \"uint32\", got \"" + name + "\"");
         }
       }},
      {"model.init", text_of(job.model.init)},

      {"eval.every", uint64_in(job.eval.every, 0)},
      {"eval.windows", int64_in(job.eval.windows, 1)},

      {"training.steps", uint64_in(job.training.steps, 1)},
      {"training.global_batch", int_in(job.training.global_batch, 1)},
      {"training.microbatch", int_in(job.training.microbatch, 1)},
      {"training.seed", uint64_in(job.training.seed, 0)},
      {"training.precision",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         try {
           job.model.precision = runtime::parse_precision(name);
         } catch (const std::invalid_argument&) {
           d.fail(v, key + " must be \"fp32\" or \"bf16\", got \"" + name + "\"");
         }
       }},
      {"training.overlap_gradient_reduce",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         if (!v.is_boolean()) d.fail(v, key + " must be true or false");
         job.training.overlap_gradient_reduce = v.as_boolean()->get();
       }},

      {"optimizer.lr", number_in(lr.peak, {.lo = 0, .lo_open = true})},
      {"optimizer.beta1", number_in(job.optimizer.beta1, {.lo = 0, .hi = 1, .hi_open = true})},
      {"optimizer.beta2", number_in(job.optimizer.beta2, {.lo = 0, .hi = 1, .hi_open = true})},
      {"optimizer.eps", number_in(job.optimizer.eps, {.lo = 0, .lo_open = true})},
      {"optimizer.weight_decay", number_in(job.optimizer.weight_decay, {.lo = 0})},
      {"optimizer.schedule",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         const auto decay = runtime::parse_lr_decay(name);
         if (!decay) d.fail(v, key + " must be \"constant\", \"linear\" or \"cosine\", got \"" + name + "\"");
         lr.decay = *decay;
       }},
      {"optimizer.warmup_steps", uint64_in(lr.warmup_steps, 0)},
      {"optimizer.min_lr", number_in(lr.min_lr, {.lo = 0})},
      {"optimizer.clip_norm", number_in(job.optimizer.clip_norm, {.lo = 0})},

      {"cluster.nodes", int_in(job.cluster.nodes, 1, 4096)},
      {"cluster.slots_per_node",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const auto m = d.integer(v, key, 1, 64);
         if (!planning::is_power_of_two(m)) d.fail(v, key + " must be a power of two (1, 2, 4, ..., 64), got " + std::to_string(m));
         job.cluster.slots_per_node = static_cast<int>(m);
       }},
      {"cluster.device",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         if (name != "cpu" && name != "cuda") d.fail(v, key + " must be \"cpu\" or \"cuda\", got \"" + name + "\"");
         job.cluster.device = name;
       }},
      {"cluster.fault_tolerance", int_in(job.cluster.fault_tolerance, 0, 4095)},
      {"cluster.device_memory_bytes", int64_in(job.cluster.device_memory_bytes, 1)},
      {"cluster.heartbeat_interval_ms", int_in(job.cluster.heartbeat_interval_ms, 1, 3'600'000)},
      {"cluster.connection_timeout_ms", int_in(job.cluster.connection_timeout_ms, 1, 24 * 3'600'000)},

      {"checkpoint.dir", text_of(job.checkpoint.dir)},
      {"checkpoint.every", uint64_in(job.checkpoint.every, 0)},

      {"http.port", int_in(job.http.port, 0, 65535)},

      {"profile.warmup", int_in(job.profile.warmup, 0)},
      {"profile.repeats", int_in(job.profile.repeats, 1)},
      {"profile.file", text_of(job.profile.file)},
      {"profile.cache", text_of(job.profile.cache)},

      {"faults.evict_after", int_in(job.faults.evict_after, 1, 1000)},
      {"faults.evict_after_stalls", int_in(job.faults.evict_after_stalls, 1, 1000)},
      {"faults.step_deadline_min_ms", number_in(job.faults.step_deadline_min_ms, {.lo = 1})},
      {"faults.step_deadline_factor", number_in(job.faults.step_deadline_factor, {.lo = 1})},
      {"faults.first_step_deadline_ms", number_in(job.faults.first_step_deadline_ms, {.lo = 1})},
      {"faults.form_deadline_ms", number_in(job.faults.form_deadline_ms, {.lo = 1, .hi = 3'600'000})},
      {"faults.digest_every", uint64_in(job.faults.digest_every, 1)},

      {"tls.certificate", text_of(job.tls.certificate)},
      {"tls.key", text_of(job.tls.key)},
      {"tls.ca_file", text_of(job.tls.ca_file)},
      {"tls.passphrase", text_of(job.tls.passphrase)},
  };
}

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
