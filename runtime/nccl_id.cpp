#include "runtime/nccl_id.hpp"

#include <stdexcept>
#include <string>

#include "runtime/device_spec.hpp"

#ifdef OOBLECK_WITH_CUDA
#include <nccl.h>
#endif

namespace oobleck::runtime {

std::vector<std::uint8_t> new_nccl_unique_id() {
#ifdef OOBLECK_WITH_CUDA
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(id.internal);
  return {bytes, bytes + NCCL_UNIQUE_ID_BYTES};
#else
  throw std::runtime_error("an NCCL data plane needs NCCL: " + no_cuda_build_reason());
#endif
}

}  // namespace oobleck::runtime
