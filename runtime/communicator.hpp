#pragma once
// The seam between stage execution and the data plane: a handful of tensor operations. Host
// transport (CPU processes), NCCL (GPUs) and an in-process fake (tests) implement it.

#include <torch/torch.h>

#include <stdexcept>
#include <vector>

namespace oobleck::runtime {

/// Any failure of the data plane: a peer died, the epoch was aborted, a fault was injected.
class comm_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  /// Posts a contiguous tensor to `peer`; returns without waiting for the receiver.
  virtual void send(const torch::Tensor& t, int peer, int tag) = 0;
  /// Fills `t` (shape and dtype known to both sides) with the next message from `peer` on `tag`.
  virtual void recv(torch::Tensor& t, int peer, int tag) = 0;
  /// In-place sum over `group` (ranks, this one included); bitwise identical on every member.
  virtual void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group) = 0;
  /// Copies `t` of `root` into `t` of every member of `group`.
  virtual void broadcast(torch::Tensor& t, int root, const std::vector<int>& group) = 0;
  /// From any thread: every pending and later operation fails with comm_error.
  virtual void abort() = 0;
};

}  // namespace oobleck::runtime
