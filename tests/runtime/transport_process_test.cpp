// End to end: ranks are processes. A peer killed with kill -9 or frozen with SIGSTOP must not
// leave any survivor blocked, and the survivors must be able to form the next epoch.

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <memory>
#include <span>
#include <sstream>
#include <thread>

#include "runtime/transport/forked_ranks.hpp"
#include "runtime/transport_test_support.hpp"

using namespace oobleck::runtime;
using namespace oobleck::runtime::transport_testing;
using namespace oobleck::runtime::forked_ranks;
using namespace std::chrono_literals;

namespace {

long long now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

std::vector<int> iota_group(int n) {
  std::vector<int> g;
  for (int r = 0; r < n; ++r) g.push_back(r);
  return g;
}

/// Child: all-reduce order-sensitive data over `group`, check it against the reference computed
/// locally, and report "sum <checksum> ok|wrong" so the test can compare processes. The
/// processes share this machine, so the sum goes through shared memory: "ok" also says it did.
void reduce_and_report(parent_line& line, host_transport& t, const std::vector<int>& group,
                       std::size_t count, std::uint32_t seed) {
  auto data = order_sensitive_data(count, seed + static_cast<std::uint32_t>(t.rank()));
  const auto before = t.all_reduce_counts().shared_memory;
  t.all_reduce_sum(group, data);
  std::vector<std::vector<float>> inputs;
  for (int r : group)
    inputs.push_back(order_sensitive_data(count, seed + static_cast<std::uint32_t>(r)));
  const bool ok = data == ring_reference(inputs) && t.all_reduce_counts().shared_memory == before + 1;
  line.send("sum " + std::to_string(checksum(data)) + (ok ? " ok" : " wrong"));
}

/// Child: waits until the test says every member is done with the epoch. Destroying a transport
/// is, for its peers, the same as crashing: a member that left while another still waited in a
/// collective of the same group would fail that collective (as it must when the member really
/// died). Ending an epoch is therefore a barrier, which the test provides here.
void leave_together(parent_line& line) {
  if (line.read() != "leave") throw std::runtime_error("expected leave");
}

/// Test: lets `ranks` destroy their transports (after their results were read).
void release(process_group& g, const std::vector<int>& ranks) {
  for (int r : ranks) g.send(r, "leave");
}

/// Test: every member's "sum" line is "ok" and carries the same checksum.
void check_sums(process_group& g, const std::vector<int>& ranks) {
  std::string first;
  for (int r : ranks) {
    const std::string line = g.read(r);
    CAPTURE(r);
    CHECK(line.size() > 3);
    CHECK(line.substr(line.size() - 3) == " ok");
    if (first.empty()) first = line;
    CHECK(line == first);
  }
}

/// Child: runs `op` on a thread; its failure is reported later as
/// "fail <name> <time ns> <kind> <peer> <what>" ("fail <name> -1 ..." if it did not fail).
struct pending_op {
  std::string name;
  std::string report;
  std::thread thread;
  template <class Op>
  pending_op(std::string n, Op op) : name(std::move(n)) {
    thread = std::thread([this, op] {
      try {
        op();
        report = "fail " + name + " -1 none -1 it completed";
      } catch (const transport_error& e) {
        report = "fail " + name + " " + std::to_string(now_ns()) + " " +
                 std::to_string(static_cast<int>(e.kind())) + " " + std::to_string(e.peer()) + " " +
                 e.what();
      }
    });
  }
  void finish(parent_line& line) {
    thread.join();
    line.send(report);
  }
};

/// Child: a recv from `silent` and an all-reduce over `group` that cannot complete, both
/// blocked when "ready" is sent. The all-reduce is the size and tag of reduce_and_report's, so
/// its shared-memory path is set up already: it blocks in the data phase, where a member waits
/// for the others' frames on the links.
void block_two_ops(parent_line& line, host_transport& t, int silent, const std::vector<int>& group,
                   std::vector<std::unique_ptr<pending_op>>& ops) {
  ops.push_back(std::make_unique<pending_op>("recv", [&t, silent] {
    std::vector<std::byte> buf(1 << 20);
    t.recv(silent, 9, buf);
  }));
  ops.push_back(std::make_unique<pending_op>("all_reduce", [&t, group] {
    std::vector<float> v(100'000, 1.0f);
    t.all_reduce_sum(group, v, 0);
  }));
  std::this_thread::sleep_for(150ms);  // let both operations block
  line.send("ready");
}

struct reported_failure {
  std::string name;
  long long at_ns = -1;
  int kind = -1;
  int peer = -2;
  std::string what;
};

reported_failure parse_failure(const std::string& line) {
  std::istringstream in(line);
  reported_failure f;
  std::string word;
  in >> word >> f.name >> f.at_ns >> f.kind >> f.peer;
  std::getline(in >> std::ws, f.what);
  return f;
}

}  // namespace

TEST_CASE("processes: all-reduce results are bitwise identical across processes") {
  process_group g(4, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, 4, 1);
    reduce_and_report(line, *t, {0, 1, 2, 3}, 300'001, 11);
    if (rank != 0) reduce_and_report(line, *t, {3, 1, 2}, 99'999, 12);
    leave_together(line);
  });
  g.exchange_ports({0, 1, 2, 3});
  check_sums(g, {0, 1, 2, 3});
  check_sums(g, {1, 2, 3});
  release(g, {0, 1, 2, 3});
  for (int r = 0; r < 4; ++r) CHECK(g.wait(r) == 0);
}

TEST_CASE("processes: kill -9 of a peer fails every pending operation of the survivors by itself") {
  constexpr int victim = 3;
  process_group g(4, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, 4, 1);
    reduce_and_report(line, *t, iota_group(4), 100'000, 21);
    if (rank == victim) {
      line.read();  // wait here for the SIGKILL
      return;
    }
    std::vector<std::unique_ptr<pending_op>> ops;
    block_two_ops(line, *t, victim, iota_group(4), ops);
    for (auto& op : ops) op->finish(line);
    // Closing this epoch tears down the other survivors' links too; wait until they have all
    // reported, so each failure is attributed to the victim alone.
    if (line.read() != "next") throw std::runtime_error("expected next");
    t.reset();
    // The next epoch among the survivors, on fresh ports.
    auto next = join_mesh(line, rank, 3, 2);
    reduce_and_report(line, *next, iota_group(3), 100'000, 22);
    leave_together(line);
  });
  g.exchange_ports({0, 1, 2, 3});
  check_sums(g, {0, 1, 2, 3});
  for (int r = 0; r < 3; ++r) REQUIRE(g.read(r) == "ready");

  const long long kill_ns = now_ns();
  g.signal(victim, SIGKILL);
  CHECK(g.wait(victim) == 128 + SIGKILL);
  // Failed by the kill (after it, and long before anything could call it a timeout); how many
  // milliseconds it takes is bench/transport_failure_latency's figure.
  for (int r = 0; r < 3; ++r)
    for (int op = 0; op < 2; ++op) {
      const auto f = parse_failure(g.read(r));
      CAPTURE(r);
      CAPTURE(f.what);
      REQUIRE(f.at_ns > 0);
      const double ms = (f.at_ns - kill_ns) / 1e6;
      CHECK(f.kind == static_cast<int>(transport_failure::peer_lost));
      CHECK(f.peer == victim);
      CHECK(f.what.find("peer 3") != std::string::npos);
      CHECK(ms >= 0);
      CHECK(ms < fails_within.count());
    }

  for (int r = 0; r < 3; ++r) g.send(r, "next");
  g.exchange_ports({0, 1, 2});
  check_sums(g, {0, 1, 2});
  release(g, {0, 1, 2});
  for (int r = 0; r < 3; ++r) CHECK(g.wait(r) == 0);
}

TEST_CASE("processes: with a peer frozen by SIGSTOP, abort() fails every pending operation") {
  constexpr int victim = 2;
  process_group g(3, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, 3, 1);
    reduce_and_report(line, *t, iota_group(3), 100'000, 31);
    if (rank == victim) {
      line.read();  // stopped, then killed, while waiting here
      return;
    }
    std::vector<std::unique_ptr<pending_op>> ops;
    block_two_ops(line, *t, victim, iota_group(3), ops);
    if (line.read() != "abort") throw std::runtime_error("expected abort");
    const long long call_ns = now_ns();
    t->abort("failure detector: rank 2 is not responding");  // from the main thread
    line.send("abort_called " + std::to_string(call_ns));
    for (auto& op : ops) op->finish(line);
    t.reset();
    auto next = join_mesh(line, rank, 2, 2);
    reduce_and_report(line, *next, iota_group(2), 100'000, 32);
    leave_together(line);
  });
  g.exchange_ports({0, 1, 2});
  check_sums(g, {0, 1, 2});
  g.signal(victim, SIGSTOP);
  for (int r = 0; r < 2; ++r) REQUIRE(g.read(r) == "ready");

  // Both survivors are told at once; whichever aborts first also tears down the other's links,
  // so a survivor may see "peer lost" before its own abort() call.
  const long long order_ns = now_ns();
  for (int r = 0; r < 2; ++r) g.send(r, "abort");
  for (int r = 0; r < 2; ++r) {
    std::istringstream called(g.read(r));
    std::string word;
    long long call_ns = 0;
    called >> word >> call_ns;
    REQUIRE(word == "abort_called");
    for (int op = 0; op < 2; ++op) {
      const auto f = parse_failure(g.read(r));
      CAPTURE(r);
      CAPTURE(f.what);
      REQUIRE(f.at_ns > 0);
      const double after_order = (f.at_ns - order_ns) / 1e6;
      const double after_call = (f.at_ns - call_ns) / 1e6;
      CHECK((f.kind == static_cast<int>(transport_failure::aborted) ||
             f.kind == static_cast<int>(transport_failure::peer_lost)));
      CHECK(after_order < fails_within.count());
      CHECK(after_call < fails_within.count());
    }
  }

  g.exchange_ports({0, 1});
  check_sums(g, {0, 1});
  release(g, {0, 1});
  for (int r = 0; r < 2; ++r) CHECK(g.wait(r) == 0);
  g.signal(victim, SIGKILL);
  CHECK(g.wait(victim) == 128 + SIGKILL);
}

TEST_CASE("processes: a zero-copy send to a frozen peer holds its buffer until the peer dies or abort()") {
  process_group g(3, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, 3, 1);
    line.send("ready");
    if (rank != 0) {
      line.read();  // frozen, then killed, while waiting here
      return;
    }
    if (line.read() != "go") throw std::runtime_error("expected go");
    // A copying send to a frozen peer waits for room at most 1 ms + 1 ms per MB, then copies
    // the rest (into fresh memory here: page faults are slow on some VMs, hence the slack).
    const std::vector<std::byte> copied(std::size_t{32} << 20, std::byte{4});
    const auto copy_start = std::chrono::steady_clock::now();
    t->send(1, 4, copied);
    const double copy_ms = ms_since(copy_start);
    // 64 MiB to each frozen peer: far more than the kernel buffers for a peer that reads nothing.
    std::weak_ptr<const std::vector<std::byte>> held[3];
    for (int peer : {1, 2}) {
      auto owner = std::make_shared<const std::vector<std::byte>>(std::size_t{64} << 20, std::byte{3});
      held[peer] = owner;
      const std::span<const std::byte> bytes(*owner);
      t->send(peer, 5, bytes, std::move(owner));
    }
    line.send("sent " + std::to_string(copy_ms));
    auto state = [&] {
      return std::string(held[1].expired() ? "released" : "held") + " " +
             (held[2].expired() ? "released" : "held");
    };
    if (line.read() != "check") throw std::runtime_error("expected check");
    line.send("before " + state());
    if (line.read() != "killed") throw std::runtime_error("expected killed");
    const auto noticed = std::chrono::steady_clock::now();
    eventually([&] { return held[1].expired(); });
    line.send("after_kill " + state() + " " + std::to_string(ms_since(noticed)));
    if (line.read() != "abort") throw std::runtime_error("expected abort");
    t->abort("test abort");
    line.send("after_abort " + state());  // right after abort() returned
  });
  g.exchange_ports({0, 1, 2});
  for (int r = 0; r < 3; ++r) REQUIRE(g.read(r) == "ready");
  g.signal(1, SIGSTOP);
  g.signal(2, SIGSTOP);
  g.send(0, "go");
  std::istringstream sent(g.read(0));
  std::string sent_word;
  double copy_ms = -1;
  sent >> sent_word >> copy_ms;
  REQUIRE(sent_word == "sent");
  // It returned although the peer stays frozen: it waited at most 1 ms + 1 ms per MB, then
  // copied the rest.
  CHECK(copy_ms >= 0);
  CHECK(copy_ms < fails_within.count());
  std::this_thread::sleep_for(200ms);
  g.send(0, "check");
  CHECK(g.read(0) == "before held held");
  g.signal(1, SIGKILL);
  CHECK(g.wait(1) == 128 + SIGKILL);
  g.send(0, "killed");
  std::istringstream after_kill(g.read(0));
  std::string word, one, two;
  double ms = -1;
  after_kill >> word >> one >> two >> ms;
  CHECK(one == "released");  // the link to the dead peer failed and dropped the send
  CHECK(two == "held");      // the other frozen peer's send is still pending
  CHECK(ms >= 0);
  CHECK(ms < fails_within.count());
  g.send(0, "abort");
  CHECK(g.read(0) == "after_abort released released");
  CHECK(g.wait(0) == 0);
  g.signal(2, SIGKILL);
  CHECK(g.wait(2) == 128 + SIGKILL);
}
