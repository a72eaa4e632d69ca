// The in-process fake reduces exactly like the host transport: pipelines on threads over the fake
// and the same pipelines in processes over the transport end with bitwise equal replicas only if
// every all-reduce adds in the same order, whatever the group size.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cstring>
#include <future>

#include "runtime/host_communicator.hpp"
#include "runtime/transport_test_support.hpp"
#include "support/deadline.hpp"
#include "support/fake_communicator.hpp"

using namespace oobleck;
using namespace std::chrono_literals;
using runtime::transport_testing::order_sensitive_data;

namespace {

/// Inputs of the members of `group`, in group position order.
std::vector<std::vector<float>> inputs_of(const std::vector<int>& group, std::size_t numel) {
  std::vector<std::vector<float>> in;
  for (std::size_t i = 0; i < group.size(); ++i) in.push_back(order_sensitive_data(numel, 100 + static_cast<int>(i)));
  return in;
}

torch::Tensor tensor_of(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<std::int64_t>(v.size())}, torch::kFloat32).clone();
}

std::vector<float> values_of(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

/// Each member's all_reduce_sum result over `group`, run by `world` ranks on threads through
/// `comm(rank)`; `release` aborts them if they run past the deadline.
template <class Comm>
std::vector<std::vector<float>> reduce_on_threads(int world, const std::vector<int>& group,
                                                  const std::vector<std::vector<float>>& in, Comm comm,
                                                  const std::function<void()>& release) {
  std::vector<std::vector<float>> out(group.size());
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      runtime::communicator& c = comm(r);
      const auto pos = std::find(group.begin(), group.end(), r) - group.begin();
      if (pos == static_cast<std::ptrdiff_t>(group.size())) return;
      auto t = tensor_of(in[pos]);
      c.all_reduce_sum(t, group, 0);
      out[pos] = values_of(t);
    }));
  testing::wait_or_fail(ranks, 30s, "an all-reduce rank", release);
  for (auto& f : ranks) f.get();
  return out;
}

/// The same over the host transport, through the runtime's host_communicator.
std::vector<std::vector<float>> reduce_over_transport(int world, const std::vector<int>& group,
                                                      const std::vector<std::vector<float>>& in) {
  auto transports = runtime::transport_testing::make_transports(world, 1);
  const auto endpoints = runtime::transport_testing::endpoints_of(transports);
  std::vector<std::unique_ptr<runtime::host_communicator>> comms;
  for (auto& t : transports) comms.push_back(std::make_unique<runtime::host_communicator>(*t));
  return reduce_on_threads(
      world, group, in,
      [&](int r) -> runtime::communicator& {
        transports[r]->connect(endpoints);
        return *comms[r];
      },
      [&] {
        for (auto& t : transports) t->abort("the test's deadline");
      });
}

std::vector<std::vector<float>> reduce_over_fake(int world, const std::vector<int>& group,
                                                 const std::vector<std::vector<float>>& in) {
  testing::fake_hub hub(world);
  return reduce_on_threads(
      world, group, in, [&](int r) -> runtime::communicator& { return hub.at(r); }, [&] { hub.abort_all(); });
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the fake's all-reduce is bitwise the host transport's for groups of 3 and 4") {
  // Groups of two cannot tell orders apart (a + b == b + a); 3 and 4 can. One group is permuted:
  // the ring follows the order the caller gives, not the rank numbers. 1,200,000 floats per
  // member make chunks of several 1 MiB segments in the transport; 1,001 does not divide evenly.
  const std::vector<std::pair<int, std::vector<int>>> cases{
      {3, {0, 1, 2}}, {4, {0, 1, 2, 3}}, {4, {3, 1, 0, 2}}, {4, {1, 3, 2}}};
  for (const auto& [world, group] : cases)
    for (std::size_t numel : {std::size_t{1001}, std::size_t{1'200'000}}) {
      CAPTURE(world);
      CAPTURE(group.size());
      CAPTURE(group.front());
      CAPTURE(numel);
      const auto in = inputs_of(group, numel);
      const auto fake = reduce_over_fake(world, group, in);
      const auto real = reduce_over_transport(world, group, in);
      const auto expected = runtime::transport_testing::ring_reference(in);
      // The data tells the orders apart: the old fake (plain sum in group order) differs here.
      CHECK(runtime::transport_testing::differs_from_serial(in, expected) > numel / 100);
      for (std::size_t m = 0; m < group.size(); ++m) {
        CAPTURE(m);
        CHECK(bitwise_equal(real[m], expected));
        CHECK(bitwise_equal(fake[m], real[m]));
      }
    }
}

TEST_CASE("the fake's broadcast copies the root's tensor to every member of a group of 3") {
  const std::vector<int> group{2, 0, 3};
  const auto in = inputs_of(group, 257);
  testing::fake_hub hub(4);
  std::vector<std::vector<float>> out(group.size());
  std::vector<std::future<void>> ranks;
  for (std::size_t pos = 0; pos < group.size(); ++pos)
    ranks.push_back(std::async(std::launch::async, [&, pos] {
      auto t = tensor_of(in[pos]);
      hub.at(group[pos]).broadcast(t, 0, group, 0);  // root: rank 0, group position 1
      out[pos] = values_of(t);
    }));
  testing::wait_or_fail(ranks, 30s, "a broadcast rank", [&] { hub.abort_all(); });
  for (auto& f : ranks) f.get();
  for (const auto& o : out) CHECK(bitwise_equal(o, in[1]));
}
