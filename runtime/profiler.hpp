#pragma once
// Per-layer profiling (ARCHITECTURE.md §4): forward and backward timed separately (backward really runs),
// each layer where a stage runs it (a microbatch forward through every layer, then backward in reverse),
// warm-up then the median of repeats, parameter bytes, and the activation bytes autograd retains
// per in-flight microbatch, counted by the CPU allocator (on a GPU: the caching allocator's live
// bytes). Unlike the reference code, backward is not assumed to be a multiple of forward and
// activations are not measured under no_grad. On a GPU every timed op is waited for (the device
// synchronised before and after it), so the times are the device's, not the launch's.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planning/profile.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/gpt_config.hpp"

namespace oobleck::runtime {

struct profiler_options {
  int microbatch = 4;
  int warmup = 2;
  int repeats = 7;
  std::int64_t device_memory_bytes = 4LL << 30;  ///< memory of one CPU slot, recorded in the profile
  /// M (the job's cluster.slots_per_node, a power of two): every stage width d = 1, 2, ..., M is
  /// measured with d LibTorch intra-op threads, which is how the runtime runs a stage of width d.
  int slots_per_node = 1;
  /// Where the layers run: the CPU, or a GPU (a build with OOBLECK_WITH_CUDA; slots_per_node 1).
  device_spec device;
  /// The clock the timings are read from (steady_clock::now when empty); tests give a virtual one.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

struct layer_measurement {
  std::string name;
  double forward_ms = 0;   ///< median at width 1
  double backward_ms = 0;  ///< median at width 1
  std::vector<double> forward_samples, backward_samples;  ///< at width 1
  /// Medians per stage width: index i is width 2^i (d intra-op threads), up to slots_per_node.
  std::vector<double> forward_ms_by_width, backward_ms_by_width;
  std::int64_t param_bytes = 0;
  std::int64_t activation_bytes = 0;  ///< live after forward minus live before (output included)
  std::int64_t output_bytes = 0;      ///< the layer's output (0 for the head, whose output is the loss)
  double optimizer_ms = 0;            ///< median of AdamW steps over its parameters (one thread)
};

/// Measures every layer of the model on options.device, at every stage width d = 1, 2, ..., M of
/// options.slots_per_node with d intra-op threads (one thread again afterwards).
std::vector<layer_measurement> measure_layers(const gpt_config& model, const profiler_options& options);

/// One microbatch's forward and backward through the model's first two layers (the embedding and the
/// first block), on options.device with one compute thread, as a
/// callable that owns its own copy of those layers: the op that measure_loopback_link runs right
/// after a receive, to see what an op pays for starting on a thread that blocked.
std::function<void()> first_layers_op(const gpt_config& model, const profiler_options& options);

/// The planning profile of those measurements and of the link between two nodes (all zero: free):
/// gpus_per_node = slots_per_node, times for every width, tagged with the model's config hash,
/// the microbatch and the device kind ("cpu", or "cuda:" and the GPU's name) so that a profile of
/// another job is refused.
planning::profile make_profile(const gpt_config& model, const profiler_options& options,
                               const std::vector<layer_measurement>& layers, planning::link_profile link = {});

/// A device tensor on the host data plane is staged through host memory: copied to the host before
/// it is sent and back to a device after it arrives (runtime/host_communicator.cpp). The bytes per
/// ms of that staging for a message of `bytes` on `device`: the median of `repeats` copies there and
/// back, each timed to the device's completion. std::invalid_argument for the CPU (nothing is staged).
double measure_device_staging(const device_spec& device, std::int64_t bytes, int repeats);

/// Bytes currently allocated through LibTorch's CPU allocator (counting starts at the first call).
std::int64_t live_cpu_bytes();

}  // namespace oobleck::runtime
