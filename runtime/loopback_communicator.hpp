#pragma once
// A node's communicator for its stages (ARCHITECTURE.md §4: a node of M slots may run several stages of one
// pipeline, consecutive ones). Two adjacent stages on the same node address each other by the
// node's own rank; the host transport has no link to itself, so those messages are handed over in
// memory here, with the communicator's usual matching: (peer, tag), in send order per tag.
// Everything else (other ranks, every collective) goes to the wrapped communicator.

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::runtime {

class loopback_communicator final : public communicator {
 public:
  /// `base` must outlive this object; all threads of the node's stages may use it at once.
  explicit loopback_communicator(communicator& base) : base_(base) {}

  int rank() const override { return base_.rank(); }
  /// To this very rank: queues `t` itself (no copy), which the sender must not modify afterwards
  /// (the same contract as the host communicator's zero-copy send).
  void send(const torch::Tensor& t, int peer, int tag) override;
  /// From this very rank: waits for the next message on `tag` and copies it into `t`; a size or
  /// dtype that differs is comm_failure::mismatch.
  void recv(torch::Tensor& t, int peer, int tag) override;
  /// From this very rank: the sent tensor itself, reshaped (no copy: an activation or a gradient
  /// handed between two stages of the node); from another rank, as the wrapped communicator.
  torch::Tensor recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options, int peer, int tag) override;
  /// From this very rank: received at wait() (the hand-off copies nothing anyway); from another
  /// rank, posted on the wrapped communicator.
  std::unique_ptr<pending_recv> post_recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options, int peer,
                                                int tag) override {
    if (peer != rank()) return base_.post_recv_owned(shape, options, peer, tag);
    return communicator::post_recv_owned(shape, options, peer, tag);
  }
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override {
    base_.all_reduce_sum(t, group, tag);
  }
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override {
    base_.broadcast(t, root, group, tag);
  }
  /// Aborts the wrapped communicator and fails every pending and later local receive.
  void abort() override;

 private:
  communicator& base_;
  std::mutex mu_;
  std::condition_variable arrived_;
  std::map<int, std::deque<torch::Tensor>> queued_;  // by tag
  bool aborted_ = false;

  /// The next message to this rank on `tag` (waits), checked against `numel` elements of `dtype`.
  torch::Tensor take(int tag, std::int64_t numel, at::ScalarType dtype, std::int64_t expected_bytes);
};

}  // namespace oobleck::runtime
