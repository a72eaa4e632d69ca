// Receives posted before their messages arrive (recv_all, posted_recv), between ranks on threads
// of one process over loopback TCP, and links that carry messages as soon as each is up.

#include <doctest/doctest.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport/host_transport.hpp"
#include "runtime/transport_test_support.hpp"

using namespace oobleck::runtime;
using namespace oobleck::runtime::transport_testing;

TEST_CASE("p2p: recv_all takes the messages of several peers and tags at once, whatever their order") {
  // Rank 2's messages are sent at once, so most arrive before rank 0 posts anything (kept,
  // then copied); rank 1 sends after a pause, in another order than the items', so its
  // messages arrive while every item is posted (read straight into place).
  const std::vector<std::byte> big1 = pattern(8 * mib, 1), small1 = pattern(100, 2), late1 = pattern(mib, 3);
  const std::vector<std::byte> big2 = pattern(8 * mib, 4), mid2 = pattern(3 * mib, 5);
  std::vector<std::vector<std::byte>> got{std::vector<std::byte>(8 * mib), std::vector<std::byte>(8 * mib),
                                          std::vector<std::byte>(100), std::vector<std::byte>(3 * mib),
                                          std::vector<std::byte>(mib)};
  std::vector<std::size_t> done_order;
  run_ranks(3, [&](int rank, host_transport& t) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      t.send(0, 2, small1);
      t.send(0, 1, big1);
      t.send(0, 1, late1);
    } else if (rank == 2) {
      t.send(0, 2, mid2);
      t.send(0, 1, big2);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::vector<host_transport::recv_item> items{
          {1, 1, got[0]}, {2, 1, got[1]}, {1, 2, got[2]}, {2, 2, got[3]}, {1, 1, got[4]}};
      t.recv_all(items, [&](std::size_t i) { done_order.push_back(i); });
    }
  });
  CHECK(same(got[0], big1));
  CHECK(same(got[1], big2));
  CHECK(same(got[2], small1));
  CHECK(same(got[3], mid2));
  CHECK(same(got[4], late1));  // the second message of (1, tag 1), after the first
  CHECK(done_order == std::vector<std::size_t>{0, 1, 2, 3, 4});
}

TEST_CASE("p2p: recv_all may be posted before its link is up, and says when every item is posted") {
  // The layer copies post their receives at once, then tell the senders to go, while the mesh
  // may still be connecting.
  auto ts = make_transports(2, 1);
  const auto eps = endpoints_of(ts);
  const std::vector<std::byte> sent = pattern(4 * mib, 9);
  std::vector<std::byte> got(4 * mib);
  std::vector<std::string> events;  // on rank 0's receiving thread
  std::promise<void> posted;
  auto receiving = std::async(std::launch::async, [&] {
    const std::vector<host_transport::recv_item> items{{1, 3, got}};
    ts[0]->recv_all(
        items, [&](std::size_t) { events.emplace_back("done"); },
        [&] {
          events.emplace_back("posted");
          posted.set_value();
        });
  });
  std::future<void> connecting;
  const abort_all_on_exit guard{ts};  // a failed check must not leave the threads above waiting
  REQUIRE(posted.get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  connecting = std::async(std::launch::async, [&] { ts[0]->connect(eps); });  // only now
  ts[1]->connect(eps);
  ts[1]->send(0, 3, sent);
  REQUIRE(receiving.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  receiving.get();
  connecting.get();
  CHECK(same(got, sent));
  CHECK(events == std::vector<std::string>{"posted", "done"});
}

TEST_CASE("p2p: recv_all fails with a lost peer and leaves none of its receives posted") {
  auto ts = make_transports(3, 1);
  std::atomic<bool> failed{false};
  std::string what;
  int lost = -1;
  std::vector<std::byte> after(4);
  run_ranks(ts, [&](int rank, host_transport& t) {
    const std::vector<std::byte> first = pattern(mib, 7), second = pattern(4, 8);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ts[1].reset();  // gone before sending anything: its peers see the connection close
    } else if (rank == 2) {
      t.send(0, 7, first);
      while (!failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      t.send(0, 7, second);
    } else {
      std::vector<std::byte> a(mib), b(mib), c(mib);
      // The third item would take rank 2's next message on tag 7 if it stayed posted.
      const std::vector<host_transport::recv_item> items{{2, 7, a}, {1, 7, b}, {2, 7, c}};
      try {
        t.recv_all(items);
      } catch (const transport_error& e) {
        what = e.what();
        lost = e.peer();
      }
      failed = true;
      t.recv(2, 7, after);
    }
  });
  CHECK(lost == 1);
  CHECK(what.find("recv from peer 1 (tag 7)") == 0);
  CHECK(same(after, pattern(4, 8)));
}

TEST_CASE("p2p: a link carries messages as soon as it is up, before the rest of the mesh") {
  // Rank 2 connects only once rank 0 has rank 1's message: waiting for the whole mesh would
  // deadlock (and fail at the deadline below).
  auto ts = make_transports(3, 1);
  const auto eps = endpoints_of(ts);
  std::atomic<bool> received{false};
  std::vector<std::byte> got(mib);
  std::vector<std::exception_ptr> errors(6);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          ts[static_cast<std::size_t>(r)]->connect(eps);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    threads.emplace_back([&] {
      try {
        ts[1]->wait_connected(0);
        ts[1]->send(0, 3, pattern(mib, 9));
      } catch (...) {
        errors[2] = std::current_exception();
      }
    });
    threads.emplace_back([&] {
      try {
        ts[0]->wait_connected(1);
        ts[0]->recv(1, 3, got);
        received = true;
      } catch (...) {
        errors[3] = std::current_exception();
      }
    });
    threads.emplace_back([&] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!received.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      try {
        ts[2]->connect(eps);  // completes the mesh, and with it ranks 0's and 1's connect()
      } catch (...) {
        errors[4] = std::current_exception();
      }
    });
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  CHECK(received.load());
  CHECK(same(got, pattern(mib, 9)));
  CHECK_THROWS_AS(ts[0]->wait_connected(0), std::invalid_argument);  // itself
}

TEST_CASE("p2p: wait_connected fails when connect() gives up") {
  transport_config c{.rank = 1, .peers = std::vector<peer_endpoint>(2), .epoch = 1};
  c.connect_timeout = std::chrono::milliseconds(200);
  host_transport t(c);
  // Rank 0's endpoint: this process's own listening port of another transport that never
  // answers as rank 0 would (a transport of another epoch).
  transport_config other{.rank = 0, .peers = std::vector<peer_endpoint>(2), .epoch = 2};
  host_transport stranger(other);
  std::vector<peer_endpoint> eps{{"127.0.0.1", stranger.listen_port()}, {"127.0.0.1", t.listen_port()}};
  std::exception_ptr waited;
  std::jthread waiter([&] {
    try {
      t.wait_connected(0);
    } catch (...) {
      waited = std::current_exception();
    }
  });
  CHECK_THROWS_AS(t.connect(eps), transport_error);
  waiter.join();
  REQUIRE(waited);
  CHECK_THROWS_AS(std::rethrow_exception(waited), transport_error);
}

TEST_CASE("p2p: a posted receive takes its message whenever it comes, a later recv the next one, and one never waited for is withdrawn") {
  const std::vector<std::byte> one = pattern(2 * mib, 11), two = pattern(64, 12), three = pattern(mib, 13);
  std::vector<std::byte> got_one(2 * mib), got_two(64), withdrawn(mib), got_three(mib);
  run_ranks(2, [&](int rank, host_transport& t) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // after rank 0 posted
      t.send(0, 5, one);
      t.send(0, 5, two);
      t.send(0, 6, three);
    } else {
      auto first = t.post_recv(1, 5, got_one);  // posted before its message exists: read straight into place
      {
        auto never = t.post_recv(1, 6, withdrawn);
        never.reset();  // withdrawn: tag 6's message goes to the recv below instead
      }
      first->wait();
      t.recv(1, 5, got_two);  // posted after `first`: the second message of tag 5
      t.recv(1, 6, got_three);
      CHECK_THROWS_AS(first->wait(), std::logic_error);  // once only
    }
  });
  CHECK(same(got_one, one));
  CHECK(same(got_two, two));
  CHECK(same(got_three, three));
  CHECK(std::all_of(withdrawn.begin(), withdrawn.end(), [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("p2p: a receive posted after its message arrived takes it from the mailbox, and a lost peer fails a posted one") {
  auto ts = make_transports(3, 1);
  std::string what;
  std::vector<std::byte> early(4096);
  run_ranks(ts, [&](int rank, host_transport& t) {
    if (rank == 2) {
      t.send(0, 3, pattern(4096, 21));
    } else if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ts[1].reset();  // gone without sending: rank 0's posted receive from it fails
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));  // rank 2's message is in
      auto arrived = t.post_recv(2, 3, early);
      arrived->wait();
      std::vector<std::byte> never(16);
      auto lost = t.post_recv(1, 4, never);
      try {
        lost->wait();
      } catch (const transport_error& e) {
        what = e.what();
      }
    }
  });
  CHECK(same(early, pattern(4096, 21)));
  CHECK(what.find("recv from peer 1 (tag 4)") == 0);
}

namespace {

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

/// The CPU time rank 0's thread spends in one recv whose message rank 1 sends `after` later,
/// with transport_config::spin_wait = `spin`.
double cpu_in_recv(std::chrono::microseconds spin, std::chrono::milliseconds after) {
  double cpu = -1;
  run_ranks(
      2,
      [&](int rank, host_transport& t) {
        std::vector<std::byte> b(64);
        if (rank == 1) {
          std::this_thread::sleep_for(after);
          t.send(0, 5, b);
        } else {
          const double before = thread_cpu_ms();
          t.recv(1, 5, b);
          cpu = thread_cpu_ms() - before;
        }
      },
      1, [&](transport_config& c) { c.spin_wait = spin; });
  return cpu;
}

}  // namespace

TEST_CASE("p2p: a receive waits awake (yielding its core) for spin_wait, then sleeps") {
  using namespace std::chrono_literals;
  // Thread CPU time, not wall time: a loaded machine gives the awake loop only part of a core,
  // so the bounds are wide; asleep, the thread uses next to none.
  const double asleep = cpu_in_recv(0us, 100ms);
  const double awake = cpu_in_recv(50ms, 100ms);
  const double then_asleep = cpu_in_recv(10ms, 400ms);
  INFO("CPU ms in the receive: spin 0: " << asleep << ", spin 50 ms: " << awake << ", spin 10 ms of 400: " << then_asleep);
  CHECK(asleep < 5);
  CHECK(awake > 10);
  CHECK(then_asleep < 60);
}

namespace {

/// Two connected ranks whose receives wait awake for a minute.
std::vector<std::unique_ptr<host_transport>> pair_waiting_awake() {
  auto ts = make_transports(2, 1, {}, [](transport_config& c) { c.spin_wait = std::chrono::seconds(60); });
  const auto eps = endpoints_of(ts);
  auto other = std::async(std::launch::async, [&] { ts[1]->connect(eps); });
  ts[0]->connect(eps);
  other.get();
  return ts;
}

}  // namespace

TEST_CASE("p2p: an abort ends a receive that waits awake at once") {
  using namespace std::chrono_literals;
  auto ts = pair_waiting_awake();
  std::vector<std::byte> b(64);
  auto waiting = std::async(std::launch::async, [&] { ts[0]->recv(1, 5, b); });
  abort_all_on_exit guard{ts};
  std::this_thread::sleep_for(100ms);
  const auto aborted_at = std::chrono::steady_clock::now();
  ts[0]->abort("the test aborts");
  REQUIRE(waiting.wait_for(fails_within) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - aborted_at < fails_within);
  CHECK_THROWS_AS(waiting.get(), transport_error);
}

namespace {

/// Rank 1 sends rank 0 a stream of messages of every size on two tags, pausing now and then so
/// that rank 0 often waits before its message is there; rank 0 receives them in order and
/// checks every byte. Returns rank 0's transport's waiting_reads().
std::uint64_t stream_to_a_waiting_receiver(bool read_while_waiting) {
  using namespace std::chrono_literals;
  const std::vector<std::size_t> sizes = {0, 1, 100, 8192, (64u << 10) + 3, mib + 7, 8192, 5 * mib};
  constexpr int rounds = 6;
  std::uint64_t reads = 0;
  run_ranks(
      2,
      [&](int rank, host_transport& t) {
        for (int r = 0; r < rounds; ++r)
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            const auto tag = static_cast<std::uint32_t>(1 + i % 2);
            const auto seed = static_cast<std::uint32_t>(r * 100 + static_cast<int>(i));
            if (rank == 1) {
              if (i % 3 == 0) std::this_thread::sleep_for(2ms);  // rank 0 waits for this one
              t.send(0, tag, pattern(sizes[i], seed));
            } else {
              std::vector<std::byte> got(sizes[i]);
              t.recv(1, tag, got);
              CHECK(same(got, pattern(sizes[i], seed)));
            }
          }
        if (rank == 0) reads = t.waiting_reads();
      },
      1,
      [&](transport_config& c) {
        c.spin_wait = 5s;  // every receive waits awake
        c.read_while_waiting = read_while_waiting;
      });
  return reads;
}

}  // namespace

TEST_CASE("p2p: a receive that waits awake reads its link itself, and every message of every size arrives intact and in order") {
  const std::uint64_t reads = stream_to_a_waiting_receiver(true);
  MESSAGE("reads made by the waiting receiver: " << reads);
  CHECK(reads > 0);
  CHECK(stream_to_a_waiting_receiver(false) == 0);  // off: only the I/O thread reads
}

TEST_CASE("p2p: a peer that goes away while a receive waits awake (reading the link itself) fails it at once, named") {
  using namespace std::chrono_literals;
  auto ts = pair_waiting_awake();
  auto peer = std::move(ts[1]);
  ts.pop_back();
  // Messages first, until the waiting thread has read one itself (on a loaded machine the I/O
  // thread may get to some first).
  std::vector<std::byte> b(64);
  for (int i = 0; i < 100 && ts[0]->waiting_reads() == 0; ++i) {
    auto first = std::async(std::launch::async, [&] { ts[0]->recv(1, 5, b); });
    std::this_thread::sleep_for(5ms);
    peer->send(0, 5, pattern(64, 3));
    REQUIRE(first.wait_for(fails_within) == std::future_status::ready);
    first.get();
  }
  REQUIRE(ts[0]->waiting_reads() > 0);
  std::string what;
  auto waiting = std::async(std::launch::async, [&] {
    try {
      ts[0]->recv(1, 5, b);
    } catch (const transport_error& e) {
      what = e.what();
    }
  });
  abort_all_on_exit guard{ts};
  std::this_thread::sleep_for(50ms);
  const auto gone_at = std::chrono::steady_clock::now();
  peer.reset();  // closes its sockets, as a crash would
  REQUIRE(waiting.wait_for(fails_within) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - gone_at < fails_within);
  waiting.get();
  CAPTURE(what);
  CHECK(what.find("recv from peer 1 (tag 5): peer 1 closed the connection") == 0);
  // The link stays failed: a later receive fails the same way, and the transport still aborts.
  CHECK_THROWS_WITH_AS(ts[0]->recv(1, 5, b), doctest::Contains("peer 1 closed the connection"), transport_error);
}
