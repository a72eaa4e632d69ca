#pragma once
// Per-layer profiling (DESIGN §4): forward and backward timed separately (backward really runs),
// warm-up then the median of repeats, parameter bytes, and the activation bytes autograd retains
// per in-flight microbatch, counted by the CPU allocator. Unlike the reference code, backward is
// not assumed to be a multiple of forward and activations are not measured under no_grad.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planning/profile.hpp"
#include "runtime/gpt_config.hpp"

namespace oobleck::runtime {

struct profiler_options {
  int microbatch = 4;
  int warmup = 2;
  int repeats = 7;
  std::int64_t device_memory_bytes = 4LL << 30;  ///< memory of one CPU slot, recorded in the profile
  /// The clock the timings are read from (steady_clock::now when empty); tests give a virtual one.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

struct layer_measurement {
  std::string name;
  double forward_ms = 0;   ///< median
  double backward_ms = 0;  ///< median
  std::vector<double> forward_samples, backward_samples;
  std::int64_t param_bytes = 0;
  std::int64_t activation_bytes = 0;  ///< live after forward minus live before (output included)
};

/// Measures every layer of the model on the CPU with one intra-op thread.
std::vector<layer_measurement> measure_layers(const gpt_config& model, const profiler_options& options);

/// The planning profile of those measurements: width 1 only (stages run on one device each; the
/// executor has no multi-device stages yet), tagged with the model's config hash, the microbatch
/// and the device kind so that a profile of another job is refused.
planning::profile make_profile(const gpt_config& model, const profiler_options& options,
                               const std::vector<layer_measurement>& layers);

/// Bytes currently allocated through LibTorch's CPU allocator (counting starts at the first call).
std::int64_t live_cpu_bytes();

}  // namespace oobleck::runtime
