#include "runtime/gradient_reducer.hpp"

#include "runtime/device.hpp"

namespace oobleck::runtime {

gradient_reducer::gradient_reducer(communicator& comm) : comm_(comm) {}

gradient_reducer::~gradient_reducer() {
  cancel();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void gradient_reducer::post(torch::Tensor buffer, std::vector<int> group, int tag) {
  std::lock_guard lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  queue_.push_back({std::move(buffer), std::move(group), tag});
  ++outstanding_;
  changed_.notify_all();
}

void gradient_reducer::loop() {
  // The summation of the host transport runs on this thread: one intra-op thread, like the stage.
  torch::NoGradGuard no_grad;
  std::unique_lock lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    job j = std::move(queue_.front());
    queue_.pop_front();
    if (!error_) {
      lock.unlock();
      std::exception_ptr failed;
      try {
        use_device_on_this_thread(j.buffer.device());
        comm_.all_reduce_sum(j.buffer, j.group, j.tag);
      } catch (...) {
        failed = std::current_exception();
      }
      j = {};  // the buffer's reference goes before the waiter may free the storage
      lock.lock();
      if (failed && !error_) error_ = failed;
    }
    --outstanding_;
    changed_.notify_all();
  }
}

void gradient_reducer::wait() {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return outstanding_ == 0; });
  if (auto e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
}

void gradient_reducer::cancel() noexcept {
  std::unique_lock lock(mu_);
  if (outstanding_ == 0) {
    error_ = nullptr;
    return;
  }
  lock.unlock();
  comm_.abort();
  lock.lock();
  changed_.wait(lock, [&] { return outstanding_ == 0; });
  error_ = nullptr;
}

bool gradient_reducer::busy() const {
  std::lock_guard lock(mu_);
  return outstanding_ > 0 || error_ != nullptr;
}

}  // namespace oobleck::runtime
