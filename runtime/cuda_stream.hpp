#pragma once
// LibTorch's current CUDA stream of the calling thread, for code that must not include the CUDA
// LibTorch headers (runtime/nccl_communicator.cpp is compiled on machines without them, so that it
// cannot rot). Defined in runtime/cuda_support.cpp, built only with OOBLECK_WITH_CUDA=ON.

#include <cuda_runtime_api.h>

namespace oobleck::runtime {

/// c10::cuda::getCurrentCUDAStream(device).stream().
cudaStream_t current_cuda_stream(int device);

}  // namespace oobleck::runtime
