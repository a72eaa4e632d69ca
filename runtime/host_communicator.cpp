#include "runtime/host_communicator.hpp"

#include <memory>

namespace oobleck::runtime {

namespace {

std::span<std::byte> bytes_of(const torch::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous())
    throw std::invalid_argument("host transport: tensors must be contiguous and on the CPU");
  return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
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
  // Zero-copy: the transport writes straight from the tensor's storage and holds a reference to
  // the tensor (refcounted, shared with the caller) until the bytes are written or dropped.
  // Callers never modify a tensor after sending it (activations and gradients are only read
  // afterwards), so no copy is needed to make send() return at once.
  const auto bytes = bytes_of(t);
  auto keep = std::make_shared<const torch::Tensor>(t);
  translated([&] { transport_.send(peer, static_cast<std::uint32_t>(tag), bytes, std::move(keep)); });
}

void host_communicator::recv(torch::Tensor& t, int peer, int tag) {
  translated([&] { transport_.recv(peer, static_cast<std::uint32_t>(tag), bytes_of(t)); });
}

namespace {

class posted_tensor final : public pending_recv {
 public:
  posted_tensor(torch::Tensor t, std::unique_ptr<host_transport::posted_recv> posted)
      : t_(std::move(t)), posted_(std::move(posted)) {}
  torch::Tensor wait() override {
    translated([&] { posted_->wait(); });
    return t_;
  }

 private:
  torch::Tensor t_;  // declared first: destroyed after posted_, whose destructor may still read into it
  std::unique_ptr<host_transport::posted_recv> posted_;
};

}  // namespace

std::unique_ptr<pending_recv> host_communicator::post_recv_owned(at::IntArrayRef shape,
                                                                 const torch::TensorOptions& options, int peer,
                                                                 int tag) {
  auto t = torch::empty(shape, options);
  std::unique_ptr<host_transport::posted_recv> posted;
  translated([&] { posted = transport_.post_recv(peer, static_cast<std::uint32_t>(tag), bytes_of(t)); });
  return std::make_unique<posted_tensor>(std::move(t), std::move(posted));
}

void host_communicator::recv_all(const std::vector<tensor_recv>& items, const std::function<void(std::size_t)>& done,
                                 const std::function<void()>& posted) {
  std::vector<host_transport::recv_item> raw;
  raw.reserve(items.size());
  for (const auto& it : items) raw.push_back({it.peer, static_cast<std::uint32_t>(it.tag), bytes_of(it.t)});
  translated([&] { transport_.recv_all(raw, done, posted); });
}

void host_communicator::all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) {
  if (t.scalar_type() != torch::kFloat32) throw std::invalid_argument("host transport: all-reduce is float32 only");
  const auto b = bytes_of(t);
  translated([&] {
    transport_.all_reduce_sum(group, {reinterpret_cast<float*>(b.data()), static_cast<std::size_t>(t.numel())},
                              static_cast<std::uint32_t>(tag));
  });
}

void host_communicator::broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) {
  translated([&] { transport_.broadcast(group, root, bytes_of(t), static_cast<std::uint32_t>(tag)); });
}

}  // namespace oobleck::runtime
