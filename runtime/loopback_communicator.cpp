#include "runtime/loopback_communicator.hpp"

#include <string>

namespace oobleck::runtime {

void loopback_communicator::send(const torch::Tensor& t, int peer, int tag) {
  if (peer != rank()) {
    base_.send(t, peer, tag);
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (aborted_) throw comm_error(comm_failure::aborted, -1, "send to this rank (tag " + std::to_string(tag) + "): aborted");
    queued_[tag].push_back(t);
  }
  arrived_.notify_all();
}

torch::Tensor loopback_communicator::take(int tag, std::int64_t numel, at::ScalarType dtype, std::int64_t expected_bytes) {
  torch::Tensor message;
  {
    std::unique_lock lock(mu_);
    arrived_.wait(lock, [&] { return aborted_ || !queued_[tag].empty(); });
    if (aborted_)
      throw comm_error(comm_failure::aborted, -1, "recv from this rank (tag " + std::to_string(tag) + "): aborted");
    auto& q = queued_[tag];
    message = std::move(q.front());
    q.pop_front();
  }
  if (message.numel() != numel || message.scalar_type() != dtype)
    throw comm_error(comm_failure::mismatch, rank(),
                     "recv from this rank (tag " + std::to_string(tag) + "): " + std::to_string(message.nbytes()) +
                         " bytes sent, " + std::to_string(expected_bytes) + " expected");
  return message;
}

void loopback_communicator::recv(torch::Tensor& t, int peer, int tag) {
  if (peer != rank()) {
    base_.recv(t, peer, tag);
    return;
  }
  const auto message = take(tag, t.numel(), t.scalar_type(), static_cast<std::int64_t>(t.nbytes()));
  torch::NoGradGuard no_grad;
  t.copy_(message.reshape(t.sizes()));
}

torch::Tensor loopback_communicator::recv_owned(at::IntArrayRef shape, const torch::TensorOptions& options, int peer,
                                                int tag) {
  if (peer != rank()) return base_.recv_owned(shape, options, peer, tag);
  std::int64_t numel = 1;
  for (auto d : shape) numel *= d;
  const auto dtype = options.dtype().toScalarType();
  auto message = take(tag, numel, dtype, numel * static_cast<std::int64_t>(c10::elementSize(dtype)));
  if (message.device() != options.device()) return message.reshape(shape).to(options.device());
  // A view of the sender's tensor, detached from its graph: the receiver's autograd is its own.
  return message.detach().reshape(shape);
}

void loopback_communicator::abort() {
  {
    std::lock_guard lock(mu_);
    aborted_ = true;
    queued_.clear();
  }
  arrived_.notify_all();
  base_.abort();
}

}  // namespace oobleck::runtime
