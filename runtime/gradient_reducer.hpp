#pragma once
// The per-layer gradient all-reduce on a communication thread of its own, so that a layer's
// all-reduce runs while the stage's remaining backward work goes on (issue 7, item 8).
//
// Reductions run one at a time in the order they are posted. Every holder of a layer posts the
// same layers in the same order (the executor posts in decreasing layer index, the order in which
// a backward pass makes them final), so the globally highest pending layer can always complete:
// no cycle of waits. The executor gives each layer's all-reduce a tag of its own (the layer
// index), so the reducers of two stages of one node (a node of several slots) never issue
// collectives of the same (group, tag) in an order the other holders do not share. The sum
// itself is the communicator's (the host transport's fixed ring order), so when it runs does not
// change a single bit of the result.

#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::runtime {

class gradient_reducer {
 public:
  /// `comm` must outlive the reducer.
  explicit gradient_reducer(communicator& comm);
  /// Cancels what is pending (cancel()) and joins the thread.
  ~gradient_reducer();
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;

  /// Queues the in-place sum of `buffer` over `group`, a collective of tag `tag`. The caller
  /// leaves `buffer` alone until wait() or cancel() returns.
  void post(torch::Tensor buffer, std::vector<int> group, int tag);
  /// Blocks until every posted reduction has finished; rethrows the first failure (the ones
  /// posted after a failure are skipped: the step is lost anyway). Afterwards the reducer is idle
  /// and empty again.
  void wait();
  /// The step failed: if anything is pending, aborts the communicator (every pending and later
  /// operation of this rank fails at once: the epoch is over) and waits until the thread no
  /// longer touches any buffer. Never throws.
  void cancel() noexcept;
  /// Something was posted and not yet waited for or cancelled.
  bool busy() const;

 private:
  struct job {
    torch::Tensor buffer;
    std::vector<int> group;
    int tag = 0;
  };
  void loop();

  communicator& comm_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<job> queue_;
  int outstanding_ = 0;  ///< posted and not finished (queued or running)
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  ///< started on the first post
};

}  // namespace oobleck::runtime
