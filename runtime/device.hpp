#pragma once
// The device seam: stage code asks for a device by kind and never hard-codes one.

#include <torch/torch.h>

#include <optional>
#include <string>

#include "runtime/device_spec.hpp"

namespace oobleck::runtime {

enum class device_kind { cpu, cuda };

/// The device `index` of that kind. CUDA needs a build with OOBLECK_WITH_CUDA=ON against a CUDA
/// LibTorch and a visible GPU; otherwise std::runtime_error says which is missing.
torch::Device make_device(device_kind kind, int index = 0);

/// The device a flag or a job names (runtime/device_spec.hpp), as make_device above.
torch::Device make_device(const device_spec& d);

/// Makes `d` the calling thread's current device when it is a GPU (nothing for the CPU): LibTorch's
/// own operators guard their device, but a thread that never named one has no current CUDA context,
/// and cuBLAS then warns and picks the primary context of device 0. Called by every thread of a stage
/// that computes (the slots' threads, the gradient reducer's).
void use_device_on_this_thread(const torch::Device& d);

/// "cpu" or "cuda:<name>", the device kind a profile records.
std::string describe(const torch::Device& d);

/// "cpu" / "cuda" (case-sensitive); throws std::invalid_argument otherwise.
device_kind parse_device_kind(const std::string& text);

/// One CPU thread for this process's tensor math, so that a process (a stage, the profiler, a
/// single-process baseline) computes on one core and processes sharing a machine do not fight
/// over its cores: LibTorch's intra-op pool and the BLAS library's own pool. Debian's LibTorch
/// calls OpenBLAS (the pthread build), whose pool torch::set_num_threads does not reach: without
/// this, every process ran each matrix product on every core, and two workers on two cores ran
/// their compute at half speed (measured: bench/RESULTS.md, "Failure-free throughput").
void use_one_compute_thread();

/// The BLAS library's thread count, where the library says (OpenBLAS); nullopt otherwise.
std::optional<int> blas_threads();

}  // namespace oobleck::runtime
