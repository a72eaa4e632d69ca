#pragma once
// An in-process communicator for tests: ranks are threads of one process, messages and
// collectives are deterministic, and faults are knobs. all_reduce_sum adds in the host
// transport's documented order (runtime/transport/host_transport.hpp): chunk c of n,
// elements [numel*c/n, numel*(c+1)/n), is accumulated left to right from group position c round
// the ring, ((x_c + x_c+1) + x_c+2) + ..., so a pipeline on threads over this hub and the same
// pipeline in processes over the transport reduce to bitwise identical gradients.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::testing {

class fake_hub {
 public:
  explicit fake_hub(int ranks);
  ~fake_hub();

  /// The communicator of `rank`; owned by the hub.
  runtime::communicator& at(int rank);
  int size() const { return static_cast<int>(comms_.size()); }

  // Fault knobs. Each surfaces as comm_error in the affected operations, never as a hang, except
  // block(), which hangs like a frozen peer until that rank (or every rank) is aborted.
  void fail_after(int rank, int ops);  ///< the rank's next `ops` operations succeed, later ones throw
  void crash(int rank);                ///< like a killed process: its peers' operations with it fail
  void block(int rank);                ///< its operations wait until abort
  void drop_sends_of(int rank);        ///< its messages vanish; receivers wait until aborted
  void abort_all();

  int operations(int rank) const;
  /// Waits until at least `ranks` ranks are parked in the hub at once (each waiting for a message,
  /// a collective, or an abort because it is blocked); false if that takes longer than `timeout`.
  /// With every rank of a pipeline parked, nothing moves until a knob changes: a test can then
  /// inject the fault or abort it needs, without sleeping and hoping the ranks got there.
  bool wait_until_parked(int ranks, std::chrono::milliseconds timeout);

 private:
  class endpoint;
  friend class endpoint;
  using key = std::tuple<int, int, int>;  // from, to, tag
  struct collective {
    std::map<int, torch::Tensor> contributions;
    torch::Tensor result;
    int collected = 0;
  };

  void check(int rank, std::unique_lock<std::mutex>& lock, std::initializer_list<int> peers);
  template <class Pred>
  void park(std::unique_lock<std::mutex>& lock, Pred ready);
  void send(int from, const torch::Tensor& t, int to, int tag);
  void recv(int to, torch::Tensor& t, int from, int tag);
  void reduce(int rank, torch::Tensor& t, const std::vector<int>& group, int root, int tag);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::unique_ptr<endpoint>> comms_;
  std::map<key, std::deque<torch::Tensor>> mailboxes_;
  std::map<std::tuple<std::vector<int>, int, int>, collective> collectives_;  // (group, tag, sequence)
  std::map<std::tuple<int, std::vector<int>, int>, int> sequence_;            // (rank, group, tag) -> next
  std::vector<int> ops_, fail_after_;
  int parked_ = 0;
  std::set<int> crashed_, blocked_, dropping_, aborted_;
};

}  // namespace oobleck::testing
