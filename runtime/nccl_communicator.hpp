#pragma once
// The communicator seam over NCCL for GPU stages (built with OOBLECK_WITH_CUDA=ON). Every
// communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the caller:
// waits poll the stream, the communicator's async error and this object's abort flag, and
// abort() calls ncclCommAbort on every communicator of the epoch.
//
// Not run in this repository's CI (no GPU); see README "GPU path".

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::runtime {

class nccl_communicator final : public communicator {
 public:
  /// On one rank; the control plane carries the bytes to the others.
  static std::vector<std::uint8_t> new_unique_id();

  /// Joins the epoch's world communicator on CUDA device `device`. Collective over the world.
  nccl_communicator(int rank, int world, const std::vector<std::uint8_t>& unique_id, int device);
  ~nccl_communicator() override;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// One sub-communicator per distinct group (the per-layer all-reduce groups of the epoch).
  /// Collective over the world: every rank passes the same list in the same order.
  void prepare_groups(const std::vector<std::vector<int>>& groups);

  int rank() const override { return rank_; }
  /// Enqueued on a send stream after the work that produced `t`; returns at once and keeps `t`
  /// alive until the transfer completes. NCCL matches sends and receives per peer in issue
  /// order, so the tag is not transmitted (the executor issues them in schedule order).
  void send(const torch::Tensor& t, int peer, int tag) override;
  void recv(torch::Tensor& t, int peer, int tag) override;
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override;
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override;
  void abort() override;

 private:
  /// Polls until `stream` drains; throws comm_error on an NCCL async error or abort.
  void wait(cudaStream_t stream, ncclComm_t comm, const char* what);
  /// Non-blocking NCCL calls may return ncclInProgress: poll until the call is issued.
  void issued(ncclResult_t r, ncclComm_t comm, const char* what);
  /// The stream waits for work already queued on the current (default) stream.
  void after_compute(cudaStream_t stream);
  void reap_sends();
  ncclComm_t group_comm(const std::vector<int>& group);

  int rank_, world_, device_;
  ncclComm_t world_comm_ = nullptr;
  std::map<std::vector<int>, ncclComm_t> groups_;
  cudaStream_t send_stream_ = nullptr, recv_stream_ = nullptr, collective_stream_ = nullptr;
  struct pending_send {
    torch::Tensor tensor;
    cudaEvent_t done;
  };
  std::vector<pending_send> sends_;
  std::mutex mutex_;  // one NCCL call at a time per communicator
  std::atomic<bool> aborted_{false};
};

}  // namespace oobleck::runtime
