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

void loopback_communicator::recv(torch::Tensor& t, int peer, int tag) {
  if (peer != rank()) {
    base_.recv(t, peer, tag);
    return;
  }
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
  if (message.numel() != t.numel() || message.scalar_type() != t.scalar_type())
    throw comm_error(comm_failure::mismatch, peer,
                     "recv from this rank (tag " + std::to_string(tag) + "): " + std::to_string(message.nbytes()) +
                         " bytes sent, " + std::to_string(t.nbytes()) + " expected");
  torch::NoGradGuard no_grad;
  t.copy_(message.reshape(t.sizes()));
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
