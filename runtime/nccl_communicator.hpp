#pragma once
// The communicator seam over NCCL for GPU stages (built with OOBLECK_WITH_CUDA=ON). Every
// communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the caller:
// waits poll the stream, the communicator's async error (under the lock abort() takes) and this
// object's abort flag, and abort() calls ncclCommAbort on every communicator of the epoch.
//
// One object per rank and epoch: a world communicator from the epoch's unique id, then
// - prepare_links: one communicator per direction of point-to-point traffic ([sender, receiver]),
//   each with a stream of its own (runtime/nccl_plan.hpp says why one per direction);
// - prepare_groups: one communicator per distinct all-reduce group, by ncclCommSplit in rounds
//   that every rank computes alike; a group of every rank uses the world communicator.
// Each communicator has its own stream, and its operations are issued one at a time in the order
// calls reach this object: the members of a group must issue its collectives in the same order
// (the executor issues the gradient all-reduces in decreasing layer index on every holder), and
// collectives of different groups are independent. The tag of a collective is not needed for
// matching: two streams of work that would issue collectives of one group concurrently with
// different tags (a layer copy beside a gradient all-reduce) must not share this object.
//
// Streams: an operation waits (on the device) for the work already queued on LibTorch's current
// stream of the calling thread, and a send keeps its tensor alive until its transfer completed.
// A receive and a collective return once their data is in place (the host polls, abortably).
// Every public call runs under a guard that makes this object's device current on the calling
// thread (stage, reducer and copy threads alike) and restores the previous one.
//
// NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"): processes
// that share a GPU cannot be ranks of one NCCL communicator (see docs/ARCHITECTURE.md, GPU path).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/communicator.hpp"
#include "runtime/nccl_plan.hpp"

namespace oobleck::runtime {

class nccl_communicator final : public communicator {
 public:
  /// On one rank; the control plane carries the bytes to the others.
  static std::vector<std::uint8_t> new_unique_id();

  /// Starts joining the epoch's world communicator on CUDA device `device` and returns at once;
  /// collective over the world: it is ready once every rank joined (wait_ready).
  nccl_communicator(int rank, int world, const std::vector<std::uint8_t>& unique_id, int device);
  ~nccl_communicator() override;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// One communicator per distinct group of the list not prepared before (groups of fewer than 2
  /// ranks and the whole world need none). Collective over the world: every rank passes the same
  /// list; calling it again with more groups is fine.
  /// Blocks until every rank joined; throws comm_error when abort() is called meanwhile (from
  /// another thread) or NCCL fails. Every operation waits for this first.
  void wait_ready();
  void prepare_groups(const std::vector<std::vector<int>>& groups);
  /// One communicator per directed link (sender, receiver) not prepared before. Collective over
  /// the world: every rank passes the same list. send() and recv() need the link prepared.
  void prepare_links(const std::vector<std::pair<int, int>>& links);

  int rank() const override { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  /// Enqueued on the link's stream after the work queued so far on the current stream; returns
  /// at once and keeps `t` alive until the transfer completes. Messages of one link arrive in
  /// send order; the tag is not transmitted (the executor's order per link is the schedule's).
  void send(const torch::Tensor& t, int peer, int tag) override;
  void recv(torch::Tensor& t, int peer, int tag) override;
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override;
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override;
  void abort() override;
  bool aborted() const { return aborted_; }

 private:
  struct channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<int> members;  ///< world ranks in communicator rank order
  };
  /// Issues `call` (an NCCL call on `ch`) under the lock, after the current stream's work.
  template <class Call>
  void issue(channel& ch, const char* what, Call&& call);
  /// Polls until `ch`'s stream drains; throws comm_error on an NCCL async error or abort.
  void wait(channel& ch, const char* what);
  /// Non-blocking NCCL calls may return ncclInProgress: polls `comm` until the call is done.
  void issued(ncclResult_t r, ncclComm_t comm, const char* what);
  /// With mutex_ held: waits until the world communicator is ready.
  void ready_locked();
  void make_rounds(const std::vector<nccl_plan::split_round>& rounds, bool links);
  /// The communicator of a group in canonical form (nccl_plan::canonical_group).
  channel& group_channel(const std::vector<int>& canonical);
  channel& link_channel(int from, int to);
  void reap_sends();

  int rank_, world_, device_;
  channel world_channel_;
  std::map<std::vector<int>, channel> groups_;    ///< canonical group -> its communicator (member)
  std::vector<std::vector<int>> groups_made_;     ///< every group planned, member or not
  std::map<std::pair<int, int>, channel> links_;  ///< (sender, receiver) -> its communicator
  std::vector<std::pair<int, int>> links_made_;   ///< every link planned, member or not
  struct pending_send {
    torch::Tensor tensor;
    cudaEvent_t done;
  };
  std::vector<pending_send> sends_;
  std::mutex mutex_;  ///< NCCL calls, async-error reads and abort, one at a time
  std::atomic<bool> aborted_{false};
  ncclResult_t init_result_ = ncclSuccess;
  bool ready_ = false;  ///< under mutex_
};

}  // namespace oobleck::runtime
