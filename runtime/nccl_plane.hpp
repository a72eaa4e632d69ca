#pragma once
// A stage's NCCL data plane for one epoch, behind the communicator seam (docs/ARCHITECTURE.md §12
// "NCCL"): what actors/stage_forming.cpp builds when the epoch's assignment carries an NCCL id.
// A build without CUDA has the same functions, which refuse, saying why.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::runtime {

/// Starts joining the epoch's world communicator (runtime/nccl_communicator.hpp) as `rank` of
/// `world` on CUDA device `device`, from the epoch's id; returns at once. Every rank of the epoch
/// joins, or none gets further than prepare_nccl_epoch. Throws std::runtime_error in a build
/// without CUDA.
std::unique_ptr<communicator> start_nccl_epoch(int rank, int world, const std::vector<std::uint8_t>& id, int device);

/// Waits until every rank joined `comm` (start_nccl_epoch's), then makes the epoch's
/// communicators: one per directed link and one per group of two or more ranks that is not the
/// whole world. Collective: every rank passes the same lists (the assignment's p2p_links and
/// layer_groups, which the coordinator computed from the whole epoch). Fails with comm_error when
/// comm.abort() is called meanwhile (from another thread) or NCCL fails.
void prepare_nccl_epoch(communicator& comm, const std::vector<std::pair<int, int>>& links,
                        const std::vector<std::vector<int>>& groups);

}  // namespace oobleck::runtime
