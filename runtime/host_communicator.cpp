#include "runtime/host_communicator.hpp"

#include <memory>

namespace oobleck::runtime {

namespace {

std::span<std::byte> bytes_of(const torch::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous())
    throw std::invalid_argument("host transport: tensors must be contiguous and on the CPU");
  return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
}

/// A device tensor's values in host memory (the tensor itself when it is on the CPU already):
/// what the transport sends. The copy waits for the device's work on `t` (LibTorch's copy is
/// synchronous towards the host).
torch::Tensor on_host(const torch::Tensor& t) {
  if (t.device().is_cpu()) return t;
  if (!t.is_contiguous()) throw std::invalid_argument("host transport: tensors must be contiguous");
  return t.to(torch::kCPU);
}

/// A host buffer to receive a device tensor's values into (the tensor itself on the CPU).
torch::Tensor host_buffer_for(const torch::Tensor& t) {
  if (t.device().is_cpu()) return t;
  if (!t.is_contiguous()) throw std::invalid_argument("host transport: tensors must be contiguous");
  return torch::empty(t.sizes(), t.options().device(torch::kCPU));
}

/// Copies the received host values into the device tensor `t` (nothing on the CPU).
void to_device(torch::Tensor& t, const torch::Tensor& host) {
  if (!t.is_same(host)) t.copy_(host);
}

template <class F>
void translated(F&& f) {
  try {
    f();
  } catch (const transport_error& e) {
    comm_failure kind = comm_failure::other;
    switch (e.kind()) {
      case transport_failure::aborted: kind = comm_failure::aborted; break;
      case transport_failure::peer_lost: kind = comm_failure::peer_lost; break;
      case transport_failure::mismatch: kind = comm_failure::mismatch; break;
      case transport_failure::connect_failed: kind = comm_failure::peer_lost; break;
    }
    throw comm_error(kind, e.peer(), e.what());
  }
}

}  // namespace

void host_communicator::send(const torch::Tensor& t, int peer, int tag) {
  // Zero-copy on the CPU: the transport writes straight from the tensor's storage and holds a
  // reference to the tensor (refcounted, shared with the caller) until the bytes are written or
  // dropped. Callers never modify a tensor after sending it (activations and gradients are only
  // read afterwards), so no copy is needed to make send() return at once. A device tensor is
  // staged through host memory (one copy), and the copy is what the transport keeps.
  const auto host = on_host(t);
  const auto bytes = bytes_of(host);
  auto keep = std::make_shared<const torch::Tensor>(host);
  translated([&] { transport_.send(peer, static_cast<std::uint32_t>(tag), bytes, std::move(keep)); });
}

void host_communicator::recv(torch::Tensor& t, int peer, int tag) {
  auto host = host_buffer_for(t);
  translated([&] { transport_.recv(peer, static_cast<std::uint32_t>(tag), bytes_of(host)); });
  to_device(t, host);
}

namespace {

class posted_tensor final : public pending_recv {
 public:
  /// `device`: where the caller wants the message (the host buffer `t` is moved there at wait()).
  posted_tensor(torch::Tensor t, std::unique_ptr<host_transport::posted_recv> posted, torch::Device device)
      : t_(std::move(t)), posted_(std::move(posted)), device_(device) {}
  torch::Tensor wait() override {
    translated([&] { posted_->wait(); });
    return device_.is_cpu() ? t_ : t_.to(device_);
  }

 private:
  torch::Tensor t_;  // declared first: destroyed after posted_, whose destructor may still read into it
  std::unique_ptr<host_transport::posted_recv> posted_;
  torch::Device device_;
};

}  // namespace

std::unique_ptr<pending_recv> host_communicator::post_recv_owned(at::IntArrayRef shape,
                                                                 const torch::TensorOptions& options, int peer,
                                                                 int tag) {
  // A device tensor's message lands in host memory and moves to the device when it is waited for.
  const torch::Device device = options.device();
  auto t = torch::empty(shape, options.device(torch::kCPU));
  std::unique_ptr<host_transport::posted_recv> posted;
  translated([&] { posted = transport_.post_recv(peer, static_cast<std::uint32_t>(tag), bytes_of(t)); });
  return std::make_unique<posted_tensor>(std::move(t), std::move(posted), device);
}

void host_communicator::recv_all(const std::vector<tensor_recv>& items, const std::function<void(std::size_t)>& done,
                                 const std::function<void()>& posted) {
  // Device tensors receive into host buffers, each copied to its tensor as it arrives (before
  // `done` hears of it).
  std::vector<torch::Tensor> hosts;
  hosts.reserve(items.size());
  bool staged = false;
  std::vector<host_transport::recv_item> raw;
  raw.reserve(items.size());
  for (const auto& it : items) {
    hosts.push_back(host_buffer_for(it.t));
    staged = staged || !hosts.back().is_same(it.t);
    raw.push_back({it.peer, static_cast<std::uint32_t>(it.tag), bytes_of(hosts.back())});
  }
  if (!staged) {
    translated([&] { transport_.recv_all(raw, done, posted); });
    return;
  }
  const auto arrived = [&](std::size_t i) {
    auto t = items[i].t;
    to_device(t, hosts[i]);
    if (done) done(i);
  };
  translated([&] { transport_.recv_all(raw, arrived, posted); });
}

void host_communicator::all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) {
  if (t.scalar_type() != torch::kFloat32) throw std::invalid_argument("host transport: all-reduce is float32 only");
  auto host = on_host(t);
  const auto b = bytes_of(host);
  translated([&] {
    transport_.all_reduce_sum(group, {reinterpret_cast<float*>(b.data()), static_cast<std::size_t>(t.numel())},
                              static_cast<std::uint32_t>(tag));
  });
  to_device(t, host);
}

void host_communicator::broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) {
  auto host = on_host(t);
  translated([&] { transport_.broadcast(group, root, bytes_of(host), static_cast<std::uint32_t>(tag)); });
  to_device(t, host);
}

}  // namespace oobleck::runtime
