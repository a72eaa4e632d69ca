// The fake's all-reduce against host transport ranks that are real processes: groups of 3 and 4,
// order-sensitive data, bitwise equal results (compared by checksum).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <future>
#include <sstream>

#include "runtime/transport/forked_ranks.hpp"
#include "runtime/transport_test_support.hpp"
#include "support/deadline.hpp"
#include "support/fake_communicator.hpp"

using namespace oobleck;
using namespace std::chrono_literals;
namespace rt = runtime::transport_testing;
namespace forked = runtime::forked_ranks;

namespace {

constexpr std::size_t numel = 300'001;

std::vector<float> input_of(std::size_t position) { return rt::order_sensitive_data(numel, 300 + static_cast<int>(position)); }

/// Checksum of what the fake gives each member of `group` (world ranks on threads).
std::vector<std::uint64_t> fake_checksums(int world, const std::vector<int>& group) {
  testing::fake_hub hub(world);
  std::vector<std::uint64_t> out(group.size());
  std::vector<std::future<void>> members;
  for (std::size_t pos = 0; pos < group.size(); ++pos)
    members.push_back(std::async(std::launch::async, [&, pos] {
      auto data = input_of(pos);
      auto t = torch::from_blob(data.data(), {static_cast<std::int64_t>(numel)}, torch::kFloat32);
      hub.at(group[pos]).all_reduce_sum(t, group, 0);
      out[pos] = rt::checksum(data);
    }));
  testing::wait_or_fail(members, 30s, "a fake all-reduce member", [&] { hub.abort_all(); });
  for (auto& f : members) f.get();
  return out;
}

}  // namespace

TEST_CASE("processes: the fake's all-reduce is bitwise the host transport's for groups of 3 and 4") {
  const std::vector<std::vector<int>> groups{{0, 1, 2}, {0, 1, 2, 3}, {2, 0, 3, 1}};
  const int world = 4;
  // Children first: the harness forks before this process starts any thread of its own.
  forked::process_group ranks(world, [&](int rank, forked::parent_line& line) {
    auto t = forked::join_mesh(line, rank, world, 1);
    for (const auto& group : groups) {
      const auto pos = std::find(group.begin(), group.end(), rank) - group.begin();
      if (pos == static_cast<std::ptrdiff_t>(group.size())) continue;
      auto data = input_of(static_cast<std::size_t>(pos));
      t->all_reduce_sum(group, data);
      line.send("sum " + std::to_string(rt::checksum(data)));
    }
    // Destroying the transport looks like a crash to the peers: leave only once all are done.
    line.send(line.read());
  });
  ranks.exchange_ports({0, 1, 2, 3});
  for (const auto& group : groups) {
    CAPTURE(group.size());
    CAPTURE(group.front());
    std::vector<std::vector<float>> in;
    for (std::size_t pos = 0; pos < group.size(); ++pos) in.push_back(input_of(pos));
    const auto expected = rt::checksum(rt::ring_reference(in));
    CHECK(rt::differs_from_serial(in, rt::ring_reference(in)) > 0);  // the old fake's order differs
    const auto fake = fake_checksums(world, group);
    for (std::size_t pos = 0; pos < group.size(); ++pos) {
      CAPTURE(pos);
      const auto line = ranks.read(group[pos], 30s);
      REQUIRE(line.rfind("sum ", 0) == 0);
      const auto real = std::stoull(line.substr(4));
      CHECK(real == expected);
      CHECK(fake[pos] == real);
    }
  }
  // Every child got to the end (the harness's destructor then reaps them, with a deadline-free
  // waitpid only after SIGKILL).
  for (int r = 0; r < world; ++r) ranks.send(r, "bye");
  for (int r = 0; r < world; ++r) CHECK(ranks.read(r, 30s) == "bye");
}
