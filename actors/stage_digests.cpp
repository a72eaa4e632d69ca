#include "actors/stage_digests.hpp"

#include <exception>

#include "runtime/layer_store.hpp"

namespace oobleck::actors {

void compute_digests(const digest_inputs& in, messages::step_committed& out) {
  for (const auto& [layer, t] : in.layers) out.digests.push_back({layer, runtime::tensor_digest({t})});
  for (const auto& [layer, t] : in.tied) out.tied_digests.push_back({layer, runtime::tensor_digest({t})});
}

void deferred_digests::start(std::uint64_t epoch, std::uint64_t step, digest_inputs in, std::function<void()> before,
                             std::function<void()> then) {
  std::lock_guard lock(mu_);
  if (worker_.joinable()) worker_.join();
  holding_ = true;
  epoch_ = epoch;
  step_ = step;
  out_ = {};
  error_.clear();
  ready_.store(false);
  worker_ = std::thread([this, in = std::move(in), before = std::move(before), then = std::move(then)] {
    try {
      if (before) before();
      compute_digests(in, out_);
    } catch (const std::exception& e) {
      error_ = e.what();
    } catch (...) {
      error_ = "unknown error";
    }
    ready_.store(true, std::memory_order_release);
    if (then) then();
  });
}

void deferred_digests::join() {
  std::lock_guard lock(mu_);
  if (worker_.joinable()) worker_.join();
}

bool deferred_digests::holds(std::uint64_t epoch, std::uint64_t step) const {
  std::lock_guard lock(mu_);
  return holding_ && epoch_ == epoch && step_ == step;
}

deferred_digests::taken deferred_digests::take(std::uint64_t epoch, std::uint64_t step,
                                               messages::step_committed& answer, std::string& error) {
  std::lock_guard lock(mu_);
  if (!holding_ || epoch_ != epoch || step_ != step) return taken::none;
  if (!ready_.load(std::memory_order_acquire)) return taken::not_ready;
  if (!error_.empty()) {  // kept: every caller hears it, until the next start()
    error = error_;
    return taken::failed;
  }
  holding_ = false;
  answer.digests = std::move(out_.digests);
  answer.tied_digests = std::move(out_.tied_digests);
  return taken::ready;
}

}  // namespace oobleck::actors
