#pragma once
// The layer digests a node reports with a commit (the coordinator compares every layer's
// replicas), and their computation on a thread of their own while the node runs the next step
// (issue 26: digests "computed in parallel with the next step's forward where safe";
// ARCHITECTURE.md §11 "Orders that ride with the commit").
//
// It is safe because a step never writes parameters: only a commit updates them (AdamW) and only
// forming an epoch replaces them (layer copies, a checkpoint), both under the node's views lock
// held exclusively, and both wait here first (join) for the digests under way. A step reads them,
// a checkpoint reads them, and so do the digests: readers only.
// Private to the stage library (LibTorch).

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "messages/step_messages.hpp"

namespace oobleck::actors {

/// What a commit's digests are computed over: per layer, its flat parameter buffer; for each
/// layer of a tied-embedding model that holds the tied matrix, that matrix alone. These share
/// the store's storage (no copy), so they hold the committed values until the next update.
struct digest_inputs {
  std::vector<std::pair<int, torch::Tensor>> layers;
  std::vector<std::pair<int, torch::Tensor>> tied;
};

/// Hashes `in` into out.digests and out.tied_digests (runtime::tensor_digest, in `in`'s order).
void compute_digests(const digest_inputs& in, messages::step_committed& out);

/// The digests of one commit, computed on a thread of their own. Every member is thread-safe;
/// the thread touches nothing but its inputs and its result, and takes no lock of the caller's.
class deferred_digests {
 public:
  deferred_digests() = default;
  deferred_digests(const deferred_digests&) = delete;
  deferred_digests& operator=(const deferred_digests&) = delete;
  ~deferred_digests() { join(); }

  /// Starts hashing `in` for commit (epoch, step) on a new thread, after joining the previous one
  /// (its result, if never taken, is dropped). `before` runs first on that thread (the device it
  /// must use); `then` runs on it once the result is ready, also after a failure.
  void start(std::uint64_t epoch, std::uint64_t step, digest_inputs in, std::function<void()> before,
             std::function<void()> then);

  /// Waits for the thread, if one runs: afterwards nothing reads the inputs it was given.
  void join();

  /// Whether the digests of commit (epoch, step) were started and not yet taken.
  bool holds(std::uint64_t epoch, std::uint64_t step) const;

  enum class taken { none, not_ready, ready, failed };
  /// The digests of commit (epoch, step), once: when they are ready, they are added to `answer`
  /// (ready); when computing them threw, `error` says what (failed, to every caller); while they
  /// are computed, not_ready; when this holds none of that commit (or they were taken), none.
  taken take(std::uint64_t epoch, std::uint64_t step, messages::step_committed& answer, std::string& error);

 private:
  mutable std::mutex mu_;
  std::thread worker_;              // guarded by mu_ (start, join)
  bool holding_ = false;            // guarded by mu_: a result not taken yet
  std::uint64_t epoch_ = 0, step_ = 0;  // guarded by mu_
  // Written by the worker before it sets ready_ (release), read after ready_ (acquire).
  messages::step_committed out_;
  std::string error_;
  std::atomic<bool> ready_{false};
};

}  // namespace oobleck::actors
