#pragma once
// The communicator seam over the host transport: CPU tensors as bytes (zero-copy), transport
// errors as comm_error. Device (CUDA) tensors are staged through host memory: sent from a host
// copy, received into a host buffer and copied to the device (docs/ARCHITECTURE.md §12).

#include "runtime/communicator.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime {

class host_communicator final : public communicator {
 public:
  /// `transport` must outlive this object and be connected.
  explicit host_communicator(host_transport& transport) : transport_(transport) {}

  int rank() const override { return transport_.rank(); }
  /// Zero-copy for a CPU tensor: keeps a reference to `t` until its bytes are written, so `t` must
  /// not be modified in place after the call (its storage may be freed by the caller, not changed).
  /// A device tensor is copied to host memory first.
  void send(const torch::Tensor& t, int peer, int tag) override;
  void recv(torch::Tensor& t, int peer, int tag) override;
  /// Posted on the transport now (host_transport::post_recv): a message that arrives afterwards
  /// is read straight from the socket into the returned tensor.
  std::unique_ptr<pending_recv> post_recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options, int peer,
                                                int tag) override;
  /// One receive of recv_all: into `t` (contiguous; its storage must outlive the call).
  struct tensor_recv {
    torch::Tensor t;
    int peer = 0;
    int tag = 0;
  };
  /// Every receive posted at once, each message read straight into its tensor whatever the
  /// order in which they arrive; `done(i)` runs as item i has arrived, `posted` once every item
  /// is posted (host_transport::recv_all).
  void recv_all(const std::vector<tensor_recv>& items, const std::function<void(std::size_t)>& done = {},
                const std::function<void()>& posted = {});
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override;
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override;
  void abort() override { transport_.abort("aborted by the runtime"); }

 private:
  host_transport& transport_;
};

}  // namespace oobleck::runtime
