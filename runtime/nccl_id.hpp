#pragma once
// The id an epoch's NCCL communicators are made from, without LibTorch: the coordinator, which has
// no LibTorch and no GPU, draws one per epoch (ARCHITECTURE.md §12 "NCCL").

#include <cstdint>
#include <vector>

namespace oobleck::runtime {

/// A fresh ncclUniqueId: its 128 bytes (ncclGetUniqueId needs NCCL, not a GPU; the calling process
/// hosts the bootstrap of the communicators made from it). Throws std::runtime_error when NCCL
/// fails, and in a build without CUDA (saying so: no_cuda_build_reason).
std::vector<std::uint8_t> new_nccl_unique_id();

}  // namespace oobleck::runtime
