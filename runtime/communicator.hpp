#pragma once
// The seam between stage execution and the data plane: a handful of tensor operations. Host
// transport (CPU processes), NCCL (GPUs) and an in-process fake (tests) implement it.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::runtime {

/// What went wrong in the data plane.
enum class comm_failure {
  aborted,    ///< abort() was called on this rank (its epoch is over)
  peer_lost,  ///< a peer crashed, closed its side, or its link failed: peer() names it
  mismatch,   ///< the two sides disagree about a message (size): a usage bug
  injected,   ///< a fault knob of a test communicator
  other,      ///< anything else the implementation reports (CUDA, NCCL)
};

/// Any failure of the data plane, with its kind and the peer it is attributed to (-1: none).
class comm_error : public std::runtime_error {
 public:
  comm_error(comm_failure kind, int peer, const std::string& what)
      : std::runtime_error(what), kind_(kind), peer_(peer) {}
  explicit comm_error(const std::string& what) : comm_error(comm_failure::other, -1, what) {}
  [[nodiscard]] comm_failure kind() const noexcept { return kind_; }
  [[nodiscard]] int peer() const noexcept { return peer_; }

 private:
  comm_failure kind_;
  int peer_;
};

/// Tags: point-to-point messages are matched by (peer, tag) and arrive in send order per (peer,
/// tag). Collectives are matched by (group, tag): every member issues the collectives of one
/// (group, tag) in the same order; collectives of different tags are independent, so two of them
/// may run at the same time (from different threads) and be issued in different orders on
/// different members (the gradient all-reduce and a layer copy, say). Collective tags and
/// point-to-point tags are separate spaces. The NCCL communicator orders everything on one stream
/// per group and does not give different tags independence yet (issue: the GPU path).
/// A receive posted before its message is needed (communicator::post_recv_owned).
class pending_recv {
 public:
  virtual ~pending_recv() = default;
  /// Blocks until the message has arrived; returns it (a tensor the caller owns). Once only.
  virtual torch::Tensor wait() = 0;
};

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  /// Posts a contiguous tensor to `peer`; returns without waiting for the receiver.
  virtual void send(const torch::Tensor& t, int peer, int tag) = 0;
  /// Fills `t` (shape and dtype known to both sides) with the next message from `peer` on `tag`.
  virtual void recv(torch::Tensor& t, int peer, int tag) = 0;
  /// The next message from `peer` on `tag` as a tensor of `shape` and `options` that the caller
  /// owns: by default a fresh one filled by recv; where the communicator can hand over the sent
  /// tensor itself (two stages of one node, loopback_communicator), that tensor, without a copy.
  /// The caller may read it and attach autograd to it, never write it in place.
  virtual torch::Tensor recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options, int peer, int tag) {
    auto t = torch::empty(shape, options);
    recv(t, peer, tag);
    return t;
  }
  /// recv_owned, posted now and waited for later: where the communicator can (the host
  /// transport), the message is read straight into its final buffer when it arrives after the
  /// posting; by default the receive happens at wait(). Receives of one (peer, tag) are answered
  /// in posting order; destroying a pending_recv that was not waited for withdraws it.
  virtual std::unique_ptr<pending_recv> post_recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options,
                                                        int peer, int tag);
  /// In-place sum over `group` (ranks, this one included); bitwise identical on every member.
  virtual void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) = 0;
  /// Copies `t` of `root` into `t` of every member of `group`.
  virtual void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) = 0;
  /// From any thread: every pending and later operation fails with comm_error.
  virtual void abort() = 0;
};

/// The default: the receive runs at wait().
class deferred_recv final : public pending_recv {
 public:
  deferred_recv(communicator& comm, at::IntArrayRef shape, torch::TensorOptions options, int peer, int tag)
      : comm_(comm), shape_(shape.vec()), options_(options), peer_(peer), tag_(tag) {}
  torch::Tensor wait() override { return comm_.recv_owned(shape_, options_, peer_, tag_); }

 private:
  communicator& comm_;
  std::vector<std::int64_t> shape_;
  torch::TensorOptions options_;
  int peer_, tag_;
};

inline std::unique_ptr<pending_recv> communicator::post_recv_owned(at::IntArrayRef shape,
                                                                   const torch::TensorOptions& options, int peer,
                                                                   int tag) {
  return std::make_unique<deferred_recv>(*this, shape, options, peer, tag);
}

}  // namespace oobleck::runtime
