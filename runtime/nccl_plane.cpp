#include "runtime/nccl_plane.hpp"

#include <stdexcept>
#include <string>

#include "runtime/device_spec.hpp"

// The CUDA half is also compiled (not linked) by the CUDA compile check of a build without CUDA.
#if defined(OOBLECK_WITH_CUDA) || defined(OOBLECK_NCCL_COMPILE_CHECK)
#define OOBLECK_NCCL_PLANE 1
#include "runtime/nccl_communicator.hpp"
#endif

namespace oobleck::runtime {

#ifndef OOBLECK_NCCL_PLANE
namespace {
[[noreturn]] void refuse() {
  throw std::runtime_error("the epoch's data plane is NCCL, but this worker cannot run it: " + no_cuda_build_reason());
}
}  // namespace
#endif

std::unique_ptr<communicator> start_nccl_epoch(int rank, int world, const std::vector<std::uint8_t>& id, int device) {
#ifdef OOBLECK_NCCL_PLANE
  return std::make_unique<nccl_communicator>(rank, world, id, device);
#else
  (void)rank, (void)world, (void)id, (void)device;
  refuse();
#endif
}

void prepare_nccl_epoch(communicator& comm, const std::vector<std::pair<int, int>>& links,
                        const std::vector<std::vector<int>>& groups) {
#ifdef OOBLECK_NCCL_PLANE
  auto* nccl = dynamic_cast<nccl_communicator*>(&comm);
  if (!nccl) throw std::logic_error("prepare_nccl_epoch: the communicator is not start_nccl_epoch's");
  nccl->wait_ready();
  nccl->prepare_links(links);
  nccl->prepare_groups(groups);
#else
  (void)comm, (void)links, (void)groups;
  refuse();
#endif
}

}  // namespace oobleck::runtime
