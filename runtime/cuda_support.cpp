// The few things that need the CUDA LibTorch's own headers (c10/cuda): built only with
// OOBLECK_WITH_CUDA=ON; everything else reaches them through runtime/cuda_stream.hpp and
// runtime/cuda_info.hpp, whose declarations need neither.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "runtime/cuda_info.hpp"
#include "runtime/cuda_stream.hpp"

namespace oobleck::runtime {

cudaStream_t current_cuda_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

namespace {
cudaDeviceProp properties(int device) {
  cudaDeviceProp p{};
  if (const auto e = cudaGetDeviceProperties(&p, device); e != cudaSuccess)
    throw std::runtime_error("cudaGetDeviceProperties(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  return p;
}
}  // namespace

std::string cuda_device_name(int device) { return properties(device).name; }

int cuda_device_count() {
  int count = 0;
  if (const auto e = cudaGetDeviceCount(&count); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e));
  return count;
}

std::int64_t cuda_device_memory_bytes(int device) {
  return static_cast<std::int64_t>(properties(device).totalGlobalMem);
}

std::int64_t cuda_allocated_bytes(int device) {
  // Index 0 of a stat array is the aggregate over the allocator's pools, in every LibTorch since 1.x.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[0].current;
}

void set_thread_cuda_device(int device) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); }

}  // namespace oobleck::runtime
