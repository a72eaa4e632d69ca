// All-reduce and broadcast between ranks on threads of one process: the all-reduce over loopback
// TCP (the ring) and through shared memory.

#include <doctest/doctest.h>
#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include <unistd.h>

#include "runtime/transport/host_transport.hpp"
#include "runtime/transport/transport_shm.hpp"
#include "runtime/transport_test_support.hpp"

using namespace oobleck::runtime;
using namespace oobleck::runtime::transport_testing;

namespace {

/// The two paths of the all-reduce: the TCP ring, and shared memory between members on one
/// machine (the default; these ranks are threads of one process). `piece_bytes` makes the
/// shared-memory steps small, so that data goes in several pieces.
enum class path { ring, shared_memory };
std::string name_of(path p) { return p == path::ring ? "ring" : "shared memory"; }
std::function<void(transport_config&)> on(path p, std::size_t piece_bytes = 0) {
  return [p, piece_bytes](transport_config& c) {
    c.shared_memory = p == path::shared_memory;
    if (piece_bytes != 0) c.shared_memory_piece_bytes = piece_bytes;
  };
}

/// Runs one all-reduce over `group` (ring order as given) on a `world`-rank mesh and returns
/// each member's result, keyed by rank; checks that every call took path `p`.
std::map<int, std::vector<float>> all_reduce_results(int world, const std::vector<int>& group,
                                                     std::size_t count, std::uint32_t seed, path p,
                                                     std::size_t piece_bytes = 0) {
  std::map<int, std::vector<float>> results;
  std::mutex mu;
  run_ranks(
      world,
      [&](int rank, host_transport& t) {
        if (std::find(group.begin(), group.end(), rank) == group.end()) return;
        auto data = order_sensitive_data(count, seed + static_cast<std::uint32_t>(rank));
        t.all_reduce_sum(group, data);
        const auto counts = t.all_reduce_counts();
        CHECK(counts.ring == (p == path::ring ? 1u : 0u));
        CHECK(counts.shared_memory == (p == path::shared_memory ? 1u : 0u));
        std::lock_guard lock(mu);
        results[rank] = std::move(data);
      },
      1, on(p, piece_bytes));
  return results;
}

std::vector<std::vector<float>> inputs_in_ring_order(const std::vector<int>& group,
                                                     std::size_t count, std::uint32_t seed) {
  std::vector<std::vector<float>> inputs;
  for (int r : group)
    inputs.push_back(order_sensitive_data(count, seed + static_cast<std::uint32_t>(r)));
  return inputs;
}

void check_all_reduce(int world, const std::vector<int>& group, std::size_t count, path p,
                      std::size_t piece_bytes = 0) {
  CAPTURE(world);
  CAPTURE(count);
  CAPTURE(name_of(p));
  CAPTURE(piece_bytes);
  const std::uint32_t seed =
      1000u * static_cast<std::uint32_t>(world) + static_cast<std::uint32_t>(count);
  const auto results = all_reduce_results(world, group, count, seed, p, piece_bytes);
  REQUIRE(results.size() == group.size());
  const auto inputs = inputs_in_ring_order(group, count, seed);
  const auto expected = ring_reference(inputs);
  for (const auto& [rank, result] : results) {
    CAPTURE(rank);
    REQUIRE(result.size() == count);
    // Bitwise identical on every member, and bitwise the documented reduction order.
    CHECK(std::memcmp(result.data(), results.begin()->second.data(), count * sizeof(float)) == 0);
    CHECK(std::memcmp(result.data(), expected.data(), count * sizeof(float)) == 0);
  }
  // And it is the sum: only rounding separates it from the exact value.
  CHECK(worst_relative_error(inputs, results.begin()->second) < 1e-6);
  if (group.size() >= 3 && count >= 1000) {
    // The data is order sensitive: a member summing in plain rank order would disagree.
    CHECK(differs_from_serial(inputs, results.begin()->second) > count / 100);
  }
}

/// This process's shared-memory segments that still have a name in /dev/shm.
std::size_t named_segments() {
  const std::string prefix = "oobleck-" + std::to_string(::getpid()) + "-";
  std::size_t found = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++found;
  return found;
}

}  // namespace

TEST_CASE("all_reduce_sum over 2, 3 and 4 ranks is the ring-order sum, bitwise equal everywhere") {
  for (path p : {path::ring, path::shared_memory})
    for (int world : {2, 3, 4}) {
      std::vector<int> everyone;
      for (int r = 0; r < world; ++r) everyone.push_back(r);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100'003}})
        check_all_reduce(world, everyone, count, p);
    }
}

TEST_CASE("all_reduce_sum through shared memory in pieces is still the ring-order sum") {
  // Pieces of 4 KiB (1024 floats): the ring's chunk boundaries fall inside pieces, a piece
  // holds parts of several chunks, and the last piece is short.
  check_all_reduce(2, {0, 1}, 10'001, path::shared_memory, 4096);
  check_all_reduce(3, {2, 0, 1}, 5'000, path::shared_memory, 4096);
  check_all_reduce(4, {3, 1, 0, 2}, 1'023, path::shared_memory, 4096);
  check_all_reduce(4, {0, 1, 2, 3}, 3, path::shared_memory, 4096);
}

TEST_CASE("all_reduce_sum keeps the ring when a member turns shared memory off, and leaves no segment behind") {
  constexpr std::size_t count = 30'000;
  const std::vector<int> group{0, 1, 2};
  std::map<int, std::vector<float>> results;
  std::mutex mu;
  auto ts = make_transports(3, 1, {}, [](transport_config& c) { c.shared_memory = c.rank != 1; });
  run_ranks(ts, [&](int rank, host_transport& t) {
    auto data = order_sensitive_data(count, 70u + static_cast<std::uint32_t>(rank));
    t.all_reduce_sum(group, data);
    CHECK(t.all_reduce_counts().ring == 1);
    CHECK(t.all_reduce_counts().shared_memory == 0);
    std::lock_guard lock(mu);
    results[rank] = std::move(data);
  });
  const auto expected = ring_reference(
      {order_sensitive_data(count, 70), order_sensitive_data(count, 71), order_sensitive_data(count, 72)});
  for (const auto& [rank, result] : results) CHECK(result == expected);
  // The members that offered a segment removed its name once the others had answered.
  CHECK(named_segments() == 0);

  // With everyone agreeing, the segments are mapped but have no name left either.
  auto shared = make_transports(3, 2);
  run_ranks(shared, [&](int rank, host_transport& t) {
    for (int round = 0; round < 3; ++round) {
      auto data = order_sensitive_data(count, 70u + static_cast<std::uint32_t>(rank));
      t.all_reduce_sum(group, data);
      CHECK(data == expected);
    }
    CHECK(t.all_reduce_counts().shared_memory == 3);
  });
  CHECK(named_segments() == 0);
}

TEST_CASE("all_reduce_sum with chunks of several pipelined segments is still the ring-order sum") {
  // Chunks above a segment (1 MiB) travel in pieces; the boundaries here fall mid-segment and
  // the last segment of every chunk is short.
  check_all_reduce(2, {0, 1}, 3 * 262'144 + 17, path::ring);
  check_all_reduce(3, {0, 1, 2}, 1'000'003, path::ring);
  check_all_reduce(4, {2, 0, 3, 1}, 2'500'001, path::ring);
}

TEST_CASE("all_reduce_sum lets go of the caller's buffer before it returns") {
  // Fresh buffers freed right after every call: a send still reading one would be a
  // use-after-free (caught under AddressSanitizer) or corrupt the next round's data.
  constexpr std::size_t count = 1'500'007;
  std::vector<std::vector<float>> last(3);
  run_ranks(3, [&](int rank, host_transport& t) {
    for (std::uint32_t round = 0; round < 4; ++round) {
      auto data = std::make_unique<std::vector<float>>(
          order_sensitive_data(count, 10u * round + static_cast<std::uint32_t>(rank)));
      t.all_reduce_sum(std::vector<int>{0, 1, 2}, *data);
      if (round == 3) last[static_cast<std::size_t>(rank)] = *data;
      data.reset();
    }
  }, 1, on(path::ring));
  const auto expected = ring_reference(
      {order_sensitive_data(count, 30), order_sensitive_data(count, 31), order_sensitive_data(count, 32)});
  for (const auto& r : last) CHECK(r == expected);
}

TEST_CASE("all_reduce_sum over a sub-group, in the ring order the caller gives") {
  for (path p : {path::ring, path::shared_memory}) {
    check_all_reduce(4, {3, 1}, 50'000, p);
    check_all_reduce(5, {4, 0, 2}, 50'001, p);
  }
}

TEST_CASE("shared memory is offered only to members in the same network namespace (the multi-host tests keep TCP)") {
  const std::string here = shm_host_identity();
  REQUIRE_FALSE(here.empty());
  CHECK(here == shm_host_identity());
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A network namespace of its own, as a worker of the netns tests has: another "host".
    const std::string there = ::unshare(CLONE_NEWNET) == 0 ? shm_host_identity() : "unshare failed";
    [[maybe_unused]] const auto written = ::write(fds[1], there.data(), there.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string there;
  char buf[256];
  for (ssize_t got; (got = ::read(fds[0], buf, sizeof buf)) > 0;) there.append(buf, static_cast<std::size_t>(got));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (there == "unshare failed") {
    MESSAGE("skipped: no network namespace could be made here (" << (::geteuid() == 0 ? "root" : "not root") << ")");
    return;
  }
  CHECK_FALSE(there.empty());
  CHECK(there != here);
}

TEST_CASE("a segment name left by a process killed within its setup round is removed, and no other") {
  // Names as a worker gives them: /dev/shm/oobleck-PID-COOKIE. A PID above pid_max belongs to no
  // process; this process is alive.
  long pid_max = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  const std::string gone = "oobleck-" + std::to_string(pid_max + 1) + "-";
  const std::string alive = "oobleck-" + std::to_string(::getpid()) + "-";
  const std::filesystem::path shm = "/dev/shm";
  auto make = [&](const std::string& name, std::chrono::minutes age) {
    std::ofstream(shm / name) << "x";
    std::filesystem::last_write_time(shm / name, std::filesystem::file_time_type::clock::now() - age);
  };
  make(gone + "stale", std::chrono::minutes(2));
  make(gone + "fresh", std::chrono::minutes(0));  // its process may be in its setup round elsewhere
  make(alive + "old", std::chrono::minutes(2));
  CHECK(shm_remove_stale_segments() == 1);
  CHECK_FALSE(std::filesystem::exists(shm / (gone + "stale")));
  CHECK(std::filesystem::exists(shm / (gone + "fresh")));
  CHECK(std::filesystem::exists(shm / (alive + "old")));
  std::filesystem::remove(shm / (gone + "fresh"));
  std::filesystem::remove(shm / (alive + "old"));
}

TEST_CASE("all_reduce_sum on disjoint groups at the same time, and back to back on one tag") {
  // Layers of different stages reduce concurrently on disjoint groups; a stage reduces its
  // layers one after another on the same group and tag.
  constexpr std::size_t count = 20'000;
  std::map<int, std::vector<std::vector<float>>> results;
  std::mutex mu;
  const std::vector<int> left{0, 2}, right{3, 1};
  run_ranks(4, [&](int rank, host_transport& t) {
    const auto& group = (rank == 0 || rank == 2) ? left : right;
    std::vector<std::vector<float>> mine;
    for (std::uint32_t round = 0; round < 5; ++round) {
      auto data =
          order_sensitive_data(count + round, 50u * round + static_cast<std::uint32_t>(rank));
      t.all_reduce_sum(group, data);
      mine.push_back(std::move(data));
    }
    std::lock_guard lock(mu);
    results[rank] = std::move(mine);
  });
  for (const auto& group : {left, right})
    for (std::uint32_t round = 0; round < 5; ++round) {
      std::vector<std::vector<float>> inputs;
      for (int r : group)
        inputs.push_back(
            order_sensitive_data(count + round, 50u * round + static_cast<std::uint32_t>(r)));
      const auto expected = ring_reference(inputs);
      for (int r : group) CHECK(results[r][round] == expected);
    }
}

TEST_CASE("all_reduce_sum refuses a group that does not contain this rank") {
  run_ranks(2, [&](int rank, host_transport& t) {
    std::vector<float> v(4, 1.0f);
    const std::vector<int> others{1 - rank};
    CHECK_THROWS_AS(t.all_reduce_sum(others, v), std::invalid_argument);
    const std::vector<int> twice{0, 1, 0};
    CHECK_THROWS_AS(t.all_reduce_sum(twice, v), std::invalid_argument);
  });
}

TEST_CASE("all_reduce_sum between mismatched sizes is reported, and abort frees the peer") {
  for (path p : {path::ring, path::shared_memory}) {
    CAPTURE(name_of(p));
    std::vector<std::string> mismatch(2), lost(2);
    run_ranks(
        2,
        [&](int rank, host_transport& t) {
          std::vector<float> agreed(8, 1.0f), v(rank == 0 ? 8 : 9, 1.0f);
          t.all_reduce_sum(std::vector<int>{0, 1}, agreed);  // the path is set up
          try {
            t.all_reduce_sum(std::vector<int>{0, 1}, v);
          } catch (const transport_error& e) {
            // The detecting side gives up on the epoch; its abort tears the peer's operation down.
            if (e.kind() == transport_failure::mismatch) {
              mismatch[static_cast<std::size_t>(rank)] = e.what();
              t.abort("size mismatch");
            } else if (e.kind() == transport_failure::peer_lost) {
              lost[static_cast<std::size_t>(rank)] = e.what();
            }
          }
        },
        1, on(p));
    // The ring finds it on the side that receives a segment of the wrong size, and the other
    // side loses its peer; through shared memory both sides exchange the size and both find it.
    const std::size_t found = (mismatch[0].find("expected") != std::string::npos) +
                              (mismatch[1].find("expected") != std::string::npos);
    const std::size_t lost_peer = (lost[0].find("closed the connection") != std::string::npos) +
                                  (lost[1].find("closed the connection") != std::string::npos);
    if (p == path::ring) {
      CHECK(found == 1);
      CHECK(lost_peer == 1);
    } else {
      CHECK(found + lost_peer == 2);
      CHECK(found >= 1);
    }
  }
}

TEST_CASE("broadcast copies the root's bytes to every member and nobody else") {
  const auto expected = pattern(3 * (std::size_t{1} << 20) + 5, 77);
  std::map<int, std::vector<std::byte>> got;
  std::mutex mu;
  const std::vector<int> group{0, 2, 3};
  run_ranks(4, [&](int rank, host_transport& t) {
    std::vector<std::byte> buf(expected.size());
    if (rank == 2) buf = expected;
    if (rank != 1) t.broadcast(group, 2, buf);
    // Rank 1 is outside the group; a point-to-point message after the broadcast still matches.
    if (rank == 3) t.send(1, 0, buf);
    if (rank == 1) t.recv(3, 0, buf);
    std::lock_guard lock(mu);
    got[rank] = std::move(buf);
  });
  for (int r = 0; r < 4; ++r) CHECK_MESSAGE(got[r] == expected, "rank " << r);
}
