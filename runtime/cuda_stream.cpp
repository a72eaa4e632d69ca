#include "runtime/cuda_stream.hpp"

#include <c10/cuda/CUDAStream.h>

namespace oobleck::runtime {

cudaStream_t current_cuda_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

}  // namespace oobleck::runtime
