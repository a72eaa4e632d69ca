#include "support/fake_communicator.hpp"

#include <string>

namespace oobleck::testing {

using runtime::comm_error;
using runtime::comm_failure;

class fake_hub::endpoint : public runtime::communicator {
 public:
  endpoint(fake_hub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  void send(const torch::Tensor& t, int peer, int tag) override { hub_.send(rank_, t, peer, tag); }
  void recv(torch::Tensor& t, int peer, int tag) override { hub_.recv(rank_, t, peer, tag); }
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override {
    hub_.reduce(rank_, t, group, -1, tag);
  }
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override {
    hub_.reduce(rank_, t, group, root, tag);
  }
  void abort() override {
    std::lock_guard lock(hub_.mutex_);
    hub_.aborted_.insert(rank_);
    hub_.changed_.notify_all();
  }

 private:
  fake_hub& hub_;
  int rank_;
};

fake_hub::fake_hub(int ranks) : ops_(ranks, 0), fail_after_(ranks, -1) {
  for (int r = 0; r < ranks; ++r) comms_.push_back(std::make_unique<endpoint>(*this, r));
}

fake_hub::~fake_hub() = default;

runtime::communicator& fake_hub::at(int rank) { return *comms_.at(rank); }

void fake_hub::fail_after(int rank, int ops) {
  std::lock_guard lock(mutex_);
  fail_after_[rank] = ops_[rank] + ops;
}

void fake_hub::crash(int rank) {
  std::lock_guard lock(mutex_);
  crashed_.insert(rank);
  changed_.notify_all();
}

void fake_hub::block(int rank) {
  std::lock_guard lock(mutex_);
  blocked_.insert(rank);
}

void fake_hub::drop_sends_of(int rank) {
  std::lock_guard lock(mutex_);
  dropping_.insert(rank);
}

void fake_hub::abort_all() {
  std::lock_guard lock(mutex_);
  for (int r = 0; r < size(); ++r) aborted_.insert(r);
  changed_.notify_all();
}

int fake_hub::operations(int rank) const {
  std::lock_guard lock(mutex_);
  return ops_[rank];
}

bool fake_hub::wait_until_parked(int ranks, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return parked_ >= ranks; });
}

// Waits for `ready`, counted as parked while it does not hold.
template <class Pred>
void fake_hub::park(std::unique_lock<std::mutex>& lock, Pred ready) {
  if (ready()) return;
  ++parked_;
  changed_.notify_all();
  changed_.wait(lock, ready);
  --parked_;
}

// Counts the operation, applies the rank's own faults, and fails when a peer has crashed.
void fake_hub::check(int rank, std::unique_lock<std::mutex>& lock, std::initializer_list<int> peers) {
  if (aborted_.count(rank)) throw comm_error(comm_failure::aborted, -1, "rank " + std::to_string(rank) + ": aborted");
  if (crashed_.count(rank)) throw comm_error(comm_failure::injected, -1, "rank " + std::to_string(rank) + ": crashed");
  if (fail_after_[rank] >= 0 && ops_[rank] >= fail_after_[rank])
    throw comm_error(comm_failure::injected, -1, "rank " + std::to_string(rank) + ": injected failure after " + std::to_string(ops_[rank]) + " ops");
  ++ops_[rank];
  if (blocked_.count(rank)) {
    // A crashed rank stands for a dead process: its own thread stops with an error too.
    park(lock, [&] { return aborted_.count(rank) > 0 || crashed_.count(rank) > 0; });
    throw comm_error("rank " + std::to_string(rank) + (crashed_.count(rank) ? ": crashed" : ": aborted while blocked"));
  }
  for (int p : peers)
    if (crashed_.count(p))
      throw comm_error(comm_failure::peer_lost, p, "rank " + std::to_string(rank) + ": peer " + std::to_string(p) + " crashed");
}

void fake_hub::send(int from, const torch::Tensor& t, int to, int tag) {
  std::unique_lock lock(mutex_);
  check(from, lock, {to});
  if (dropping_.count(from)) return;
  mailboxes_[{from, to, tag}].push_back(t.detach().clone());
  changed_.notify_all();
}

void fake_hub::recv(int to, torch::Tensor& t, int from, int tag) {
  std::unique_lock lock(mutex_);
  check(to, lock, {from});
  auto& box = mailboxes_[{from, to, tag}];
  park(lock, [&] { return !box.empty() || aborted_.count(to) || crashed_.count(from); });
  if (box.empty()) throw comm_error("rank " + std::to_string(to) + ": recv from " + std::to_string(from) +
                                    (crashed_.count(from) ? " failed: peer crashed" : " aborted"));
  {
    torch::NoGradGuard no_grad;
    t.copy_(box.front());
  }
  box.pop_front();
}

namespace {

// The host transport's ring order (see the header): chunk c starts at group position c.
torch::Tensor ring_order_sum(const std::vector<torch::Tensor>& in_group_order) {
  const auto n = static_cast<std::int64_t>(in_group_order.size());
  const auto shape = in_group_order.front().sizes();
  std::vector<torch::Tensor> flat;
  for (const auto& t : in_group_order) flat.push_back(t.reshape({-1}));
  const std::int64_t numel = flat.front().numel();
  auto result = torch::empty({numel}, flat.front().options());
  for (std::int64_t c = 0; c < n; ++c) {
    const std::int64_t lo = numel * c / n, hi = numel * (c + 1) / n;
    auto acc = flat[c].slice(0, lo, hi).clone();
    for (std::int64_t j = 1; j < n; ++j) acc.add_(flat[(c + j) % n].slice(0, lo, hi));
    result.slice(0, lo, hi).copy_(acc);
  }
  return result.view(shape);
}

}  // namespace

// Sum in the transport's ring order (root < 0) or the root's tensor (broadcast); every member
// copies the result.
void fake_hub::reduce(int rank, torch::Tensor& t, const std::vector<int>& group, int root, int tag) {
  std::unique_lock lock(mutex_);
  check(rank, lock, {});
  // Matched per (group, tag) in issue order: collectives of other tags are independent.
  const int seq = sequence_[{rank, group, tag}]++;
  auto& c = collectives_[{group, tag, seq}];
  c.contributions[rank] = t.detach().clone();
  changed_.notify_all();
  auto failed = [&] {
    for (int m : group)
      if (crashed_.count(m)) return true;
    return aborted_.count(rank) > 0;
  };
  park(lock, [&] { return c.contributions.size() == group.size() || failed(); });
  if (c.contributions.size() != group.size()) {
    int lost = -1;
    for (int m : group)
      if (crashed_.count(m)) lost = m;
    throw comm_error(lost >= 0 ? comm_failure::peer_lost : comm_failure::aborted, lost,
                     "rank " + std::to_string(rank) + ": collective failed" +
                         (lost >= 0 ? ": peer " + std::to_string(lost) + " crashed" : std::string(": aborted")));
  }
  if (!c.result.defined()) {
    if (root >= 0) {
      c.result = c.contributions.at(root);
    } else {
      std::vector<torch::Tensor> in_group_order;
      for (int m : group) in_group_order.push_back(c.contributions.at(m));
      c.result = ring_order_sum(in_group_order);
    }
  }
  {
    torch::NoGradGuard no_grad;
    t.copy_(c.result);
  }
  if (++c.collected == static_cast<int>(group.size())) collectives_.erase({group, tag, seq});
}

}  // namespace oobleck::testing
