#include "planning/synthetic_profile.hpp"

#include <cmath>
#include <string>

namespace oobleck::planning {

profile synthetic_gpt_profile(const synthetic_gpt& c) {
  if (c.layers < 3) throw planning_error("a synthetic GPT needs at least 3 layers (embedding, block, head)");
  profile p;
  p.model = "gpt-synthetic-" + std::to_string(c.layers) + "l-h" + std::to_string(c.hidden);
  p.device_kind = "synthetic";
  p.microbatch_size = c.microbatch;
  p.gpus_per_node = c.gpus_per_node;
  p.device_memory_bytes = c.device_memory_bytes;
  const double b = c.microbatch, s = c.sequence, h = c.hidden, v = c.vocab, a = c.heads;
  const double flops_per_ms = c.device_tflops * 1e9;
  auto layer = [&](std::string name, double fwd_flops, std::int64_t params, std::int64_t acts) {
    layer_profile l;
    l.name = std::move(name);
    for (int d = 1; d <= c.gpus_per_node; d *= 2) {
      const double scale = (1.0 + c.tensor_parallel_overhead * std::log2(d)) / d;
      l.forward_ms.push_back(fwd_flops / flops_per_ms * scale);
      l.backward_ms.push_back(2 * fwd_flops / flops_per_ms * scale);
    }
    l.param_bytes = params;
    l.activation_bytes = acts;
    p.layers.push_back(std::move(l));
  };
  // Embedding lookups are memory-bound: model them as a pass over the embedding output.
  layer("embedding", 20 * b * s * h, static_cast<std::int64_t>((v + s) * h * 4), static_cast<std::int64_t>(b * s * h * 4));
  for (int i = 0; i < c.layers - 2; ++i)
    layer("block" + std::to_string(i), 24 * b * s * h * h + 4 * b * s * s * h,
          static_cast<std::int64_t>((12 * h * h + 13 * h) * 4), static_cast<std::int64_t>(34 * b * s * h + 5 * a * s * s * b));
  layer("head", 2 * b * s * h * v, static_cast<std::int64_t>((v * h + 2 * h) * 4), static_cast<std::int64_t>(b * s * (h + v) * 4));
  validate(p);
  return p;
}

}  // namespace oobleck::planning
