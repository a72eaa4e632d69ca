#include "apps/profile_measure.hpp"

#include <cstdio>

#include "runtime/link_profiler.hpp"
#include "runtime/profiler.hpp"

namespace oobleck::apps {

planning::profile measure_job_profile(const job_file& job, int repeats, const link_choice& choice,
                                      std::ostream* progress, std::optional<runtime::device_spec> device) {
  runtime::profiler_options options{.microbatch = job.training.microbatch,
                                    .warmup = job.profile.warmup,
                                    .repeats = repeats,
                                    .device_memory_bytes = job.cluster.device_memory_bytes,
                                    .slots_per_node = job.cluster.slots_per_node,
                                    .device = device.value_or(runtime::device_spec{job.cluster.device, 0})};
  if (progress)
    *progress << "profiling " << job.model.num_layers() << " layers (config " << job.model.hash() << ", microbatch "
              << options.microbatch << ", " << options.repeats << " repeats, on " << runtime::to_string(options.device)
              << ")...\n";
  const auto layers = runtime::measure_layers(job.model, options);
  char line[200];
  if (progress) {
    std::snprintf(line, sizeof line, "%-10s %12s %12s %14s %16s %12s %12s\n", "layer", "forward ms", "backward ms",
                  "param bytes", "activation bytes", "output bytes", "optimizer ms");
    *progress << line;
    for (const auto& m : layers) {
      std::snprintf(line, sizeof line, "%-10s %12.4f %12.4f %14lld %16lld %12lld %12.4f\n", m.name.c_str(),
                    m.forward_ms, m.backward_ms, static_cast<long long>(m.param_bytes),
                    static_cast<long long>(m.activation_bytes), static_cast<long long>(m.output_bytes), m.optimizer_ms);
      *progress << line;
      for (std::size_t i = 1; i < m.forward_ms_by_width.size(); ++i) {  // wider stages (slots_per_node > 1)
        std::snprintf(line, sizeof line, "  width %-3d %12.4f %12.4f\n", 1 << i, m.forward_ms_by_width[i],
                      m.backward_ms_by_width[i]);
        *progress << line;
      }
    }
  }
  planning::link_profile link;
  if (choice.latency_ms >= 0) {
    link = {choice.latency_ms, choice.gbytes_per_s * 1e6};
  } else if (!choice.none) {
    // The latency as a stage that waited for its input sees it: with the cold start of the op it
    // then runs (one of this model's, on this device).
    const auto measured = runtime::measure_loopback_link(options.repeats * 3, 64, 4 << 20,
                                                         runtime::first_layers_op(job.model, options));
    link = measured.link;
    if (progress) {
      std::snprintf(line, sizeof line,
                    "link (loopback, host data plane): latency %.4f ms as a stage that waited for its message sees "
                    "it (%.4f ms between idle threads), %.2f GB/s (%lld-byte messages)\n",
                    link.latency_ms, measured.idle_latency_ms, link.bytes_per_ms / 1e6,
                    static_cast<long long>(measured.bulk_bytes));
      *progress << line;
    }
  }
  if (!choice.none && options.device.kind != "cpu") {
    // The host data plane stages device tensors through host memory: messages pay that too.
    constexpr std::int64_t staged_bytes = 4 << 20;
    const double staging = runtime::measure_device_staging(options.device, staged_bytes, options.repeats * 3);
    link = runtime::with_staging(link, staging);
    if (progress) {
      std::snprintf(line, sizeof line,
                    "device staging (device to host and back, %lld-byte messages): %.2f GB/s; the link with it: %.2f GB/s\n",
                    static_cast<long long>(staged_bytes), staging / 1e6, link.bytes_per_ms / 1e6);
      *progress << line;
    }
  }
  return runtime::make_profile(job.model, options, layers, link);
}

}  // namespace oobleck::apps
