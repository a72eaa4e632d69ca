// The job file's keys: every key's type, bounds and what reading it sets (apps/job_schema.hpp).
#include "apps/job_schema.hpp"

#include <climits>

#include "runtime/device_spec.hpp"
#include "runtime/hf_gpt2.hpp"

namespace oobleck::apps::job_file_detail {

namespace {

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

}  // namespace

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
      {"cluster.data_plane",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         const std::string name = d.text(v, key);
         if (name != "host" && name != "nccl") d.fail(v, key + " must be \"host\" or \"nccl\", got \"" + name + "\"");
         job.cluster.data_plane = name;
       }},
      {"cluster.shared_memory",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         if (!v.is_boolean()) d.fail(v, key + " must be true or false");
         job.cluster.shared_memory = v.as_boolean()->get();
       }},
      {"cluster.spin_wait_us", int_in(job.cluster.spin_wait_us, 0, 1'000'000)},
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

}  // namespace oobleck::apps::job_file_detail
