#pragma once
// A communicator for one rank alone: a single stage over all layers never communicates (the
// single-process reference run, train_single_process). Anything that would need a peer fails.

#include <vector>

#include "runtime/communicator.hpp"

namespace oobleck::runtime {

class solo_communicator final : public communicator {
 public:
  int rank() const override { return 0; }
  void send(const torch::Tensor&, int, int) override { fail(); }
  void recv(torch::Tensor&, int, int) override { fail(); }
  void all_reduce_sum(torch::Tensor&, const std::vector<int>&, int) override {}
  void broadcast(torch::Tensor&, int, const std::vector<int>&, int) override {}
  void abort() override {}

 private:
  [[noreturn]] static void fail() { throw comm_error("a single-process run has no peers"); }
};

}  // namespace oobleck::runtime
