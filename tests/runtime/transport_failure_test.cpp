// Failures within one process: abort, a peer going away, epochs, connect errors.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/transport/host_transport.hpp"
#include "runtime/transport_test_support.hpp"

using namespace oobleck::runtime;
using namespace oobleck::runtime::transport_testing;
using namespace std::chrono_literals;

namespace {

/// A loopback port that nothing listens on (bound, then released).
std::uint16_t closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct failure {
  bool thrown = false;
  transport_failure kind = transport_failure::connect_failed;
  int peer = -2;
  std::string what;
  double ms_after = -1;  // from the moment of the cause
};

template <class Op>
failure capture(Op op, const std::atomic<long long>& cause_ns) {
  failure f;
  try {
    op();
  } catch (const transport_error& e) {
    f = {true, e.kind(), e.peer(), e.what(),
         (std::chrono::steady_clock::now().time_since_epoch().count() - cause_ns.load()) / 1e6};
  }
  return f;
}

long long now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

}  // namespace

TEST_CASE("abort fails pending operations, later operations, and the peers' operations") {
  auto ts = make_transports(3, 1);
  failure recv_fail, reduce_fail, peer_fail, later_fail;
  std::atomic<long long> abort_ns{std::numeric_limits<long long>::max()};
  run_ranks(ts, [&](int rank, host_transport& t) {
    std::vector<float> v(1000, 1.0f);
    if (rank == 0) {
      std::thread reducer([&] {
        reduce_fail = capture([&] { t.all_reduce_sum(std::vector<int>{0, 1, 2}, v); }, abort_ns);
      });
      std::vector<std::byte> b(16);
      recv_fail = capture([&] { t.recv(1, 3, b); }, abort_ns);
      reducer.join();
      later_fail = capture([&] { t.send(2, 0, b); }, abort_ns);
    } else if (rank == 1) {
      std::this_thread::sleep_for(100ms);  // let rank 0 block in both operations
      abort_ns = now_ns();
      ts[0]->abort("test abort");  // from a thread that is not rank 0's
    } else {
      std::vector<std::byte> b(16);
      peer_fail = capture([&] { t.recv(0, 1, b); }, abort_ns);
    }
  });
  REQUIRE(recv_fail.thrown);
  CHECK(recv_fail.kind == transport_failure::aborted);
  CHECK(recv_fail.what == "recv from peer 1 (tag 3): test abort");
  REQUIRE(reduce_fail.thrown);
  CHECK(reduce_fail.kind == transport_failure::aborted);
  CHECK(reduce_fail.what.find("all_reduce_sum over {0,1,2} (tag 0): test abort") == 0);
  CHECK(later_fail.kind == transport_failure::aborted);
  REQUIRE(peer_fail.thrown);
  CHECK(peer_fail.kind == transport_failure::peer_lost);
  CHECK(peer_fail.peer == 0);
  CHECK(peer_fail.what == "recv from peer 0 (tag 1): peer 0 closed the connection");
  // Failed by the abort, not by some timeout (the transport has none).
  CHECK(recv_fail.ms_after < fails_within.count());
  CHECK(reduce_fail.ms_after < fails_within.count());
  CHECK(peer_fail.ms_after < fails_within.count());
  CHECK(ts[0]->aborted());
}

TEST_CASE("a destroyed peer fails the operations that involve it, not the others") {
  auto ts = make_transports(3, 1);
  failure from_dead, in_group;
  bool unrelated_ok = false;
  std::atomic<long long> gone_ns{std::numeric_limits<long long>::max()};
  run_ranks(ts, [&](int rank, host_transport& t) {
    if (rank == 0) {
      std::this_thread::sleep_for(100ms);  // let rank 1 block on it
      t.send(2, 7, pattern(4, 7));         // never received before the end: must still be delivered
      t.send(2, 6, pattern(1, 6));
      std::vector<std::byte> ack(1);
      t.recv(2, 99, ack);  // rank 2 got tag 6, so tag 7 (same stream, earlier) has arrived
      gone_ns = now_ns();
      ts[0].reset();  // destructor: closes everything, joins its thread
    } else if (rank == 1) {
      std::thread reducer([&] {
        std::vector<float> v(100, 1.0f);
        in_group = capture([&] { t.all_reduce_sum(std::vector<int>{1, 2, 0}, v); }, gone_ns);
      });
      std::vector<std::byte> b(4);
      from_dead = capture([&] { t.recv(0, 1, b); }, gone_ns);
      reducer.join();
      t.send(2, 8, pattern(4, 8));
    } else {
      std::vector<std::byte> mark(1);
      t.recv(0, 6, mark);
      t.send(0, 99, mark);
      std::vector<float> v(100, 1.0f);
      capture([&] { t.all_reduce_sum(std::vector<int>{1, 2, 0}, v); }, gone_ns);
      std::vector<std::byte> b(4);
      t.recv(0, 7, b);  // arrived before the peer went away
      std::vector<std::byte> c(4);
      t.recv(1, 8, c);
      unrelated_ok = b == pattern(4, 7) && c == pattern(4, 8);
    }
  });
  REQUIRE(from_dead.thrown);
  CHECK(from_dead.kind == transport_failure::peer_lost);
  CHECK(from_dead.what.find("peer 0 closed the connection") != std::string::npos);
  REQUIRE(in_group.thrown);
  CHECK(in_group.peer == 0);
  CHECK(unrelated_ok);
  CHECK(from_dead.ms_after < fails_within.count());
  CHECK(in_group.ms_after < fails_within.count());
}

TEST_CASE("after an abort, the next epoch works on the same ports") {
  auto old_epoch = make_transports(3, 1);
  std::vector<std::uint16_t> ports;
  for (auto& t : old_epoch) ports.push_back(t->listen_port());
  run_ranks(old_epoch, [&](int, host_transport& t) {
    std::vector<float> v(10, 1.0f);
    t.all_reduce_sum(std::vector<int>{0, 1, 2}, v);
  });
  for (auto& t : old_epoch) t->abort("epoch 1 is over");
  // The old objects still exist; abort() alone must have freed the ports.
  auto next = make_transports(3, 2, ports);
  std::vector<std::vector<float>> results(3);
  run_ranks(next, [&](int rank, host_transport& t) {
    auto v = order_sensitive_data(1001, static_cast<std::uint32_t>(rank));
    t.all_reduce_sum(std::vector<int>{0, 1, 2}, v);
    results[static_cast<std::size_t>(rank)] = v;
  });
  const auto expected =
      ring_reference({order_sensitive_data(1001, 0), order_sensitive_data(1001, 1),
                      order_sensitive_data(1001, 2)});
  for (const auto& r : results) CHECK(r == expected);
  for (std::size_t r = 0; r < 3; ++r) CHECK(next[r]->listen_port() == ports[r]);
}

TEST_CASE("connect names the peer that cannot be reached") {
  const std::uint16_t nobody = closed_port();
  transport_config c{.rank = 1,
                     .peers = {{"127.0.0.1", nobody}, {"127.0.0.1", 0}},
                     .epoch = 4,
                     .connect_timeout = 300ms};
  host_transport t(c);
  std::string what;
  int peer = -1;
  try {
    t.connect();
  } catch (const transport_error& e) {
    CHECK(e.kind() == transport_failure::connect_failed);
    what = e.what();
    peer = e.peer();
  }
  CHECK(peer == 0);
  CHECK(what.find("could not reach peer 0 at 127.0.0.1:" + std::to_string(nobody)) !=
        std::string::npos);
  CHECK(what.find("refused") != std::string::npos);
  CHECK(t.aborted());

  // The accepting side reports a higher rank that never showed up.
  transport_config lone{.rank = 0,
                        .peers = {{"127.0.0.1", 0}, {"127.0.0.1", nobody}},
                        .epoch = 4,
                        .connect_timeout = 200ms};
  host_transport waiting(lone);
  CHECK_THROWS_WITH_AS(waiting.connect(), doctest::Contains("it never connected"), transport_error);
}

TEST_CASE("a peer of another epoch is refused") {
  transport_config current{
      .rank = 0, .peers = std::vector<peer_endpoint>(2), .epoch = 5, .connect_timeout = 300ms};
  host_transport now(current);
  transport_config stale{.rank = 1,
                         .peers = {{"127.0.0.1", now.listen_port()}, {"127.0.0.1", 0}},
                         .epoch = 4,
                         .connect_timeout = 300ms};
  host_transport old(stale);
  std::string stale_error, current_error;
  std::thread acceptor([&] {
    try {
      now.connect({{"127.0.0.1", 0}, {"127.0.0.1", old.listen_port()}});
    } catch (const transport_error& e) {
      current_error = e.what();
    }
  });
  try {
    old.connect();
  } catch (const transport_error& e) {
    stale_error = e.what();
  }
  acceptor.join();
  CHECK(stale_error.find("could not reach peer 0") != std::string::npos);
  CHECK(stale_error.find("it is at epoch 5, not 4") != std::string::npos);
  CHECK(current_error.find("peer 1") != std::string::npos);
  CHECK(current_error.find("it never connected") != std::string::npos);
}

TEST_CASE("bind errors are reported with the endpoint") {
  auto ts = make_transports(1, 1);
  transport_config c{.rank = 0, .peers = {{"127.0.0.1", ts[0]->listen_port()}}};
  CHECK_THROWS_WITH_AS(host_transport{c}, doctest::Contains("cannot listen on 127.0.0.1:"),
                       transport_error);
  ts[0]->connect();  // a world of one is connected at once
  std::vector<float> v{1.0f, 2.0f};
  ts[0]->all_reduce_sum(std::vector<int>{0}, v);
  CHECK(v == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("run_ranks fails a test whose ranks block, instead of hanging") {
  // Both ranks wait for a message nobody sends: without its deadline, run_ranks would wait forever.
  auto ts = make_transports(2, 1);
  std::atomic<int> released{0};
  CHECK_THROWS_WITH_AS(run_ranks(
                           ts,
                           [&](int rank, host_transport& t) {
                             std::vector<std::byte> b(1);
                             try {
                               t.recv(1 - rank, 0, b);
                             } catch (const transport_error&) {
                               ++released;  // the deadline's abort failed the receive
                               throw;
                             }
                           },
                           std::chrono::seconds(1)),
                       doctest::Contains("did not finish within 1 s"), std::runtime_error);
  CHECK(released == 2);
  CHECK(ts[0]->aborted());
}
