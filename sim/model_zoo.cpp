#include "sim/model_zoo.hpp"

#include <cmath>

#include "messages/input_error.hpp"

namespace oobleck::sim {

double model_spec::parameters() const {
  const double h = hidden, v = vocab, s = sequence;
  double p = blocks * (12 * h * h + 13 * h) + (v + s) * h + v * h + 2 * h;
  if (bert) p += 2 * h + h * h + h;
  return p;
}

const std::vector<model_spec>& paper_models() {
  // Sizes: BERT-large (Devlin et al.), GPT-2 medium 345M (Radford et al.), GPT-3 (Brown et al.,
  // Table 2.1). Batches: the Oobleck paper's Table 1.
  static const std::vector<model_spec> models = {
      {.name = "bert-large", .blocks = 24, .hidden = 1024, .heads = 16, .sequence = 512, .vocab = 30522, .bert = true,
       .global_batch = 8192, .microbatch = 32, .bamboo_microbatch = 4},
      {.name = "gpt2", .blocks = 24, .hidden = 1024, .heads = 16, .sequence = 1024, .vocab = 50257,
       .global_batch = 8192, .microbatch = 32, .bamboo_microbatch = 1},
      {.name = "gpt3-medium", .blocks = 24, .hidden = 1024, .heads = 16, .sequence = 2048, .vocab = 50257,
       .global_batch = 8192, .microbatch = 16, .bamboo_microbatch = 0},
      {.name = "gpt3-2.7b", .blocks = 32, .hidden = 2560, .heads = 32, .sequence = 2048, .vocab = 50257,
       .global_batch = 1024, .microbatch = 2, .bamboo_microbatch = 0},
      {.name = "gpt3-6.7b", .blocks = 32, .hidden = 4096, .heads = 32, .sequence = 2048, .vocab = 50257,
       .global_batch = 1024, .microbatch = 2, .bamboo_microbatch = 0},
  };
  return models;
}

const model_spec& find_model(std::string_view name) {
  std::string known;
  for (const auto& m : paper_models()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  throw messages::input_error("unknown model '" + std::string(name) + "' (known: " + known + ", dense-400b)");
}

planning::profile analytical_profile(const model_spec& m, int microbatch, bool checkpointing,
                                     const device_spec& dev) {
  if (microbatch < 1) throw messages::input_error("microbatch must be >= 1");
  planning::profile p;
  p.model = m.name;
  p.config_hash = "analytical:" + m.name + (checkpointing ? ":ckpt" : ":nockpt");
  p.device_kind = dev.kind;
  p.microbatch_size = microbatch;
  p.gpus_per_node = dev.gpus_per_node;
  p.device_memory_bytes = static_cast<std::int64_t>(dev.memory_bytes * dev.usable_memory_fraction);
  const double b = microbatch, s = m.sequence, h = m.hidden, a = m.heads, v = m.vocab;
  const double tokens = b * s;
  const double flops_per_ms = dev.peak_flops * dev.max_efficiency * tokens / (tokens + dev.half_efficiency_tokens) / 1e3;
  const double backward_factor = checkpointing ? 3.0 : 2.0;
  auto add = [&](std::string name, double fwd_ms, double bwd_ms, double params, double acts) {
    planning::layer_profile l;
    l.name = std::move(name);
    for (int d = 1; d <= dev.gpus_per_node; d *= 2) {
      const double scale = (1.0 + dev.tensor_parallel_overhead * std::log2(d)) / d;
      l.forward_ms.push_back(fwd_ms * scale);
      l.backward_ms.push_back(bwd_ms * scale);
    }
    l.param_bytes = static_cast<std::int64_t>(params * 4);
    l.activation_bytes = static_cast<std::int64_t>(acts);
    p.layers.push_back(std::move(l));
  };
  const double lookup_ms = 3 * tokens * h * 4 / (dev.memory_bandwidth * dev.memory_efficiency) * 1e3;
  add("embedding", lookup_ms, 2 * lookup_ms, (v + s + (m.bert ? 2 : 0)) * h, checkpointing ? tokens * 8 : tokens * h * 4 * 2);
  const double block_flops = 24 * tokens * h * h + 4 * tokens * s * h;
  // The a x s x s attention scores pass through memory about 8 times in the forward (written by
  // the QK^T GEMM, scaled and masked, softmax, dropout and its mask, read by the second GEMM),
  // 4 bytes each: without a fused attention kernel (2023's HuggingFace models) this is
  // memory-bound and, at s = 2048, costs as much as the block's GEMMs.
  const double attention_ms = 8 * 4 * a * s * tokens / (dev.memory_bandwidth * dev.memory_efficiency) * 1e3;
  const double block_ms = block_flops / flops_per_ms + attention_ms;
  const double block_acts = checkpointing ? tokens * h * 4 : 2 * (34 * tokens * h + 5 * a * s * tokens);
  for (int i = 0; i < m.blocks; ++i)
    add("block" + std::to_string(i), block_ms, backward_factor * block_ms, 12 * h * h + 13 * h, block_acts);
  const double head_flops = 2 * tokens * h * v + (m.bert ? 2 * tokens * h * h : 0);
  add("head", head_flops / flops_per_ms, backward_factor * head_flops / flops_per_ms,
      v * h + 2 * h + (m.bert ? h * h + h : 0), checkpointing ? tokens * h * 4 : tokens * (h + 2 * v) * 4);
  planning::validate(p);
  return p;
}

sim_job paper_job(const model_spec& model, int nodes, int fault_tolerance, const device_spec& device) {
  sim_job job;
  job.nodes = nodes;
  job.fault_tolerance = fault_tolerance;
  job.global_batch = model.global_batch;
  job.microbatch = model.microbatch;
  job.bamboo_microbatch = model.bamboo_microbatch > 0 ? model.bamboo_microbatch : 1;
  job.profile = analytical_profile(model, job.microbatch, true, device);
  job.bamboo_profile = analytical_profile(model, job.bamboo_microbatch, false, device);
  return job;
}

model_spec frontier_model() {
  return {.name = "dense-400b", .blocks = 126, .hidden = 16384, .heads = 128, .sequence = 8192, .vocab = 128256,
          .global_batch = 2048, .microbatch = 1, .bamboo_microbatch = 1};
}

device_spec frontier_device() {
  device_spec d;
  d.kind = "H100 SXM x8 (analytical)";
  d.peak_flops = 989e12;
  d.memory_bandwidth = 3.35e12;
  d.memory_bytes = 80e9;
  d.max_efficiency = 0.45;
  d.half_efficiency_tokens = 1024;
  d.gpus_per_node = 8;
  return d;
}

planning::profile frontier_profile(int microbatch) {
  if (microbatch < 1) throw messages::input_error("microbatch must be >= 1");
  const model_spec m = frontier_model();
  const device_spec dev = frontier_device();
  planning::profile p;
  p.model = m.name;
  p.config_hash = "analytical:" + m.name + ":ckpt";
  p.device_kind = dev.kind;
  p.microbatch_size = microbatch;
  p.gpus_per_node = dev.gpus_per_node;
  p.device_memory_bytes = static_cast<std::int64_t>(dev.memory_bytes * dev.usable_memory_fraction);
  p.link = {.latency_ms = 0.005, .bytes_per_ms = 400e9 / 1e3};
  const double b = microbatch, s = m.sequence, h = m.hidden, v = m.vocab;
  const double tokens = b * s;
  const double flops_per_ms = dev.peak_flops * dev.max_efficiency * tokens / (tokens + dev.half_efficiency_tokens) / 1e3;
  const double bytes_per_param = 2;  // bf16
  for (int i = 0; i < m.blocks; ++i) {
    double params = 12 * h * h + 13 * h;
    double flops = 24 * tokens * h * h + 4 * tokens * s * h;
    double extra_ms = 0;
    if (i == 0) {
      params += v * h;  // the embedding: a memory-bound lookup, 3 passes over b s h bf16 values
      extra_ms = 3 * tokens * h * 2 / (dev.memory_bandwidth * dev.memory_efficiency) * 1e3;
    }
    if (i == m.blocks - 1) {
      params += v * h + h;  // final norm and the untied head
      flops += 2 * tokens * h * v;
    }
    const double fwd = flops / flops_per_ms + extra_ms;
    planning::layer_profile l;
    l.name = "block" + std::to_string(i);
    for (int d = 1; d <= dev.gpus_per_node; d *= 2) {
      const double scale = (1.0 + dev.tensor_parallel_overhead * std::log2(d)) / d;
      l.forward_ms.push_back(fwd * scale);
      l.backward_ms.push_back(3 * fwd * scale);
    }
    l.param_bytes = static_cast<std::int64_t>(params * bytes_per_param);
    l.activation_bytes = static_cast<std::int64_t>(tokens * h * bytes_per_param);  // the block input
    l.output_bytes = static_cast<std::int64_t>(tokens * h * bytes_per_param);
    l.optimizer_ms = params * 28 / (dev.memory_bandwidth * dev.memory_efficiency) * 1e3;
    p.layers.push_back(std::move(l));
  }
  planning::validate(p);
  return p;
}

sim_job frontier_job(int nodes, int fault_tolerance) {
  sim_job job;
  job.nodes = nodes;
  job.fault_tolerance = fault_tolerance;
  job.global_batch = nodes;
  job.microbatch = 1;
  job.bamboo_microbatch = 1;
  job.state_factor = 8;
  job.profile = frontier_profile(1);
  job.bamboo_profile = job.profile;
  return job;
}

}  // namespace oobleck::sim
