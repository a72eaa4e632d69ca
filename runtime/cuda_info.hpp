#pragma once
// Facts of a CUDA device behind plain types (no CUDA, no LibTorch headers), for the profiler and
// the programs. Defined in runtime/cuda_support.cpp, built only with OOBLECK_WITH_CUDA=ON: code
// that calls them is compiled under #ifdef OOBLECK_WITH_CUDA.

#include <cstdint>
#include <string>

namespace oobleck::runtime {

/// The GPUs this process sees.
int cuda_device_count();
/// "NVIDIA H100 80GB HBM3", as the driver names GPU `device`.
std::string cuda_device_name(int device);
/// The GPU's memory in bytes.
std::int64_t cuda_device_memory_bytes(int device);
/// Bytes LibTorch's caching allocator has handed out on `device` now (live tensors).
std::int64_t cuda_allocated_bytes(int device);
/// The calling thread's current CUDA device (runtime/device.hpp's use_device_on_this_thread).
void set_thread_cuda_device(int device);

}  // namespace oobleck::runtime
