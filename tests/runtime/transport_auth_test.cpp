// The data plane authenticates its peers (transport_handshake.hpp) and never allocates what a
// peer asks for beyond the epoch's largest frame: strangers on raw sockets, who know the epoch
// and the ranks (the coordinator's /status shows them) but not the job token, and a broken peer
// that knows the token.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport_raw_peer.hpp"
#include "runtime/transport_test_support.hpp"

using namespace oobleck::runtime;
using namespace oobleck::runtime::transport_testing;
using namespace std::chrono_literals;

namespace {

const std::string job_token = "0123456789abcdef-the-job-token";
const std::string epoch_nonce = "5f1c0a-nonce-of-epoch-1";

std::vector<std::unique_ptr<host_transport>> keyed_transports(int n, std::uint64_t epoch, const std::string& key,
                                                              const std::string& nonce,
                                                              std::chrono::milliseconds connect_timeout = 5'000ms,
                                                              std::uint64_t max_frame = std::uint64_t{1} << 30) {
  std::vector<std::unique_ptr<host_transport>> ts;
  for (int r = 0; r < n; ++r)
    ts.push_back(std::make_unique<host_transport>(transport_config{.rank = r,
                                                                   .peers = std::vector<peer_endpoint>(static_cast<std::size_t>(n)),
                                                                   .epoch = epoch,
                                                                   .connect_timeout = connect_timeout,
                                                                   .auth_key = key,
                                                                   .auth_nonce = nonce,
                                                                   .max_frame_bytes = max_frame}));
  return ts;
}

/// A message round trip between every pair: the mesh carries the real ranks' bytes.
void exchange(int rank, host_transport& t) {
  for (int p = 0; p < t.world_size(); ++p) {
    if (p == rank) continue;
    const auto mine = pattern(1000, static_cast<std::uint32_t>(rank * 10 + p));
    t.send(p, 5, mine);
  }
  for (int p = 0; p < t.world_size(); ++p) {
    if (p == rank) continue;
    std::vector<std::byte> got(1000);
    t.recv(p, 5, got);
    CHECK(got == pattern(1000, static_cast<std::uint32_t>(p * 10 + rank)));
  }
}

/// Starts connect() on the ranks in `early` (their listeners accept from then on), runs
/// `strangers()` against them on this thread, and only then lets the other ranks connect; every
/// rank then runs body(rank, transport). Rethrows the first error; fails instead of hanging.
template <class Strangers, class Body>
void strangers_first(std::vector<std::unique_ptr<host_transport>>& ts, const std::vector<int>& early,
                     Strangers strangers, Body body) {
  const auto eps = endpoints_of(ts);
  std::promise<void> strangers_done;
  std::shared_future<void> go = strangers_done.get_future().share();
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < static_cast<int>(ts.size()); ++r) {
    const bool first = std::find(early.begin(), early.end(), r) != early.end();
    ranks.push_back(std::async(std::launch::async, [&, r, first, go] {
      if (!first) go.wait();
      ts[static_cast<std::size_t>(r)]->connect(eps);
      body(r, *ts[static_cast<std::size_t>(r)]);
    }));
  }
  const abort_all_on_exit guard{ts};
  try {
    strangers();
  } catch (...) {
    strangers_done.set_value();
    throw;
  }
  strangers_done.set_value();
  for (auto& f : ranks) REQUIRE(f.wait_for(ranks_deadline) == std::future_status::ready);
  for (auto& f : ranks) f.get();
}

}  // namespace

TEST_CASE("a stranger without the token cannot take a rank: the real peer still connects and the epoch forms") {
  auto ts = keyed_transports(3, 1, job_token, epoch_nonce);
  const std::uint16_t rank0 = ts[0]->listen_port();
  // Before the real ranks connect, strangers claim ranks 1 and 2 at rank 0 with the right epoch
  // and world: one with a guessed key, one that says hello and then waits, one that never
  // speaks. None of them may hold a rank.
  raw_peer silent(rank0), guessing(rank0), waiting(rank0), oversized(rank0);
  strangers_first(ts, {0}, [&] {
    // A claim followed at once by a frame of 2^38 bytes: refused, nothing read past the hello.
    const auto claim = make_hello({.epoch = 1, .dialer = 1, .acceptor = 0, .world = 3}, "a guessed token", epoch_nonce,
                                  read_greeting(oversized));
    REQUIRE(oversized.send(claim));
    REQUIRE(oversized.send(frame_header(channel::p2p, 0, std::uint64_t{1} << 38)));
    CHECK(oversized.closed_within(fails_within));
    CHECK(dial(guessing, {.epoch = 1, .dialer = 1, .acceptor = 0, .world = 3}, "a guessed token", epoch_nonce) ==
          handshake_status::unauthenticated);
    CHECK(guessing.closed_within(fails_within));
    const auto hello = make_hello({.epoch = 1, .dialer = 2, .acceptor = 0, .world = 3}, "", epoch_nonce, read_greeting(waiting));
    REQUIRE(waiting.send(std::span(hello).first(24)));  // the claim without its proof, held open
  }, exchange);
  // Once the mesh is up, the connections still handshaking are dropped.
  CHECK(waiting.closed_within(fails_within));
  CHECK(silent.closed_within(fails_within));
}

TEST_CASE("a handshake recorded on one connection does not open another") {
  auto ts = keyed_transports(2, 1, job_token, epoch_nonce);
  const std::uint16_t rank0 = ts[0]->listen_port();
  const link_claim claim{.epoch = 1, .dialer = 1, .acceptor = 0, .world = 2};
  // What a real rank 1 sent on an earlier connection (made here with the token, as an
  // eavesdropper would have recorded it), replayed on a new one: the acceptor's challenge differs.
  raw_peer earlier(rank0), replaying(rank0), other_epoch(rank0);
  strangers_first(ts, {0}, [&] {
    const auto recorded = make_hello(claim, job_token, epoch_nonce, read_greeting(earlier));
    read_greeting(replaying);
    REQUIRE(replaying.send(recorded));
    std::array<std::byte, ack_size> ack;
    REQUIRE(replaying.read(ack));
    CHECK(static_cast<handshake_status>(get_u32(ack.data() + 4)) == handshake_status::unauthenticated);
    // A proof made for another epoch's nonce is refused too.
    CHECK(dial(other_epoch, claim, job_token, "the nonce of another epoch") == handshake_status::unauthenticated);
  }, exchange);
}

TEST_CASE("a stranger cannot inject all-reduce frames: the sum is the ranks' own") {
  constexpr int n = 3;
  auto ts = keyed_transports(n, 1, job_token, epoch_nonce);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(order_sensitive_data(4096, static_cast<std::uint32_t>(r)));
  const std::vector<float> expected = ring_reference(inputs);
  // Strangers claim rank 2 at rank 0 and rank 1 and at once (without waiting for an answer)
  // send the all-reduce segments a rank 2 would: large values that would land on every replica.
  std::vector<float> poison(4096 / n + 1, 1e30f);
  std::vector<std::unique_ptr<raw_peer>> strangers;
  for (int at : {0, 1})
    strangers.push_back(std::make_unique<raw_peer>(ts[static_cast<std::size_t>(at)]->listen_port()));
  std::vector<std::vector<float>> results(n);
  strangers_first(ts, {0, 1}, [&] {
    for (int at : {0, 1}) {
      raw_peer& s = *strangers[static_cast<std::size_t>(at)];
      const auto hello = make_hello({.epoch = 1, .dialer = 2, .acceptor = at, .world = n}, "a guessed token",
                                    epoch_nonce, read_greeting(s));
      s.send(hello);
      for (int segment = 0; segment < 4; ++segment) {
        s.send(frame_header(channel::all_reduce, 0, poison.size() * sizeof(float)));
        s.send(std::as_bytes(std::span(poison)));
      }
    }
  }, [&](int rank, host_transport& t) {
    std::vector<float> data = inputs[static_cast<std::size_t>(rank)];
    const std::vector<int> group{0, 1, 2};
    t.all_reduce_sum(group, data);
    results[static_cast<std::size_t>(rank)] = std::move(data);
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(checksum(results[static_cast<std::size_t>(r)]) == checksum(expected));
  }
}

TEST_CASE("ranks with different tokens or nonces never link, and say why") {
  for (const bool same_token : {false, true}) {
    CAPTURE(same_token);
    std::vector<std::unique_ptr<host_transport>> ts;
    for (int r = 0; r < 2; ++r)
      ts.push_back(std::make_unique<host_transport>(transport_config{
          .rank = r,
          .peers = std::vector<peer_endpoint>(2),
          .epoch = 1,
          .connect_timeout = 600ms,
          .auth_key = same_token ? job_token : job_token + std::to_string(r),
          .auth_nonce = same_token ? epoch_nonce + std::to_string(r) : epoch_nonce}));
    const auto eps = endpoints_of(ts);
    auto other = std::async(std::launch::async, [&]() -> std::string {
      try {
        ts[0]->connect(eps);
      } catch (const transport_error& e) {
        return e.what();
      }
      return "";
    });
    try {
      ts[1]->connect(eps);
      FAIL("rank 1 linked with a rank that holds another key");
    } catch (const transport_error& e) {
      CHECK(e.kind() == transport_failure::connect_failed);
      CHECK(std::string(e.what()).find("refused this rank's proof of the job's key") != std::string::npos);
    }
    // The acceptor's side says who failed to prove the key, at its own deadline.
    CHECK(other.get().find("peer 1 at 127.0.0.1:" + std::to_string(eps[1].port) +
                           " (a connection claiming it from 127.0.0.1 could not prove the job's key)") != std::string::npos);
  }
}

TEST_CASE("a listener that cannot prove the token gets nothing from the dialer") {
  // A stranger listens where rank 0 should be, and answers rank 1's hello with "ok" and a made-up
  // proof: rank 1 must not take it for rank 0.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  socklen_t len = sizeof at;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len) == 0);
  const std::uint16_t port = ntohs(at.sin_port);

  transport_config c{.rank = 1,
                     .peers = {{"127.0.0.1", port}, {"127.0.0.1", 0}},
                     .epoch = 1,
                     .connect_timeout = 1'500ms,
                     .auth_key = job_token,
                     .auth_nonce = epoch_nonce};
  host_transport rank1(c);
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread impostor([&] {
    while (!stop) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      raw_peer conn(raw_peer::adopt_t{}, ::accept(listener, nullptr, nullptr));
      std::array<std::byte, greeting_size> greeting;
      put_u32(greeting.data(), handshake_magic);
      put_u32(greeting.data() + 4, handshake_version);
      const challenge_bytes mine = fresh_challenge();
      std::memcpy(greeting.data() + 8, mine.data(), challenge_size);
      std::array<std::byte, hello_size> hello;
      if (!conn.send(greeting) || !conn.read(hello, 1s)) continue;
      std::array<std::byte, ack_size> ack{};
      put_u32(ack.data(), handshake_magic);
      put_u32(ack.data() + 4, static_cast<std::uint32_t>(handshake_status::ok));
      put_u64(ack.data() + 8, 1);
      const challenge_bytes junk = fresh_challenge();
      std::memcpy(ack.data() + 16, junk.data(), challenge_size);  // not a proof
      if (conn.send(ack)) ++answered;
    }
  });
  std::string error;
  try {
    rank1.connect();
  } catch (const transport_error& e) {
    error = e.what();
  }
  stop = true;
  impostor.join();
  ::close(listener);
  CHECK(answered > 0);
  CHECK(error.find("the listener could not prove the job's key") != std::string::npos);
}

namespace {

/// Rank 0 of a world of two, and a broken rank 1 on a raw socket that proved the token.
struct rank0_and_raw_rank1 {
  std::vector<std::unique_ptr<host_transport>> ts;
  std::unique_ptr<raw_peer> rank1;

  /// `spin_wait`: how long rank 0's receives wait awake (reading the link themselves).
  explicit rank0_and_raw_rank1(std::uint64_t max_frame, std::chrono::microseconds spin_wait = std::chrono::microseconds(300)) {
    ts.push_back(std::make_unique<host_transport>(transport_config{.rank = 0,
                                                                   .peers = std::vector<peer_endpoint>(2),
                                                                   .epoch = 1,
                                                                   .connect_timeout = 5'000ms,
                                                                   .auth_key = job_token,
                                                                   .auth_nonce = epoch_nonce,
                                                                   .max_frame_bytes = max_frame,
                                                                   .spin_wait = spin_wait}));
    auto connecting = std::async(std::launch::async, [&] { ts[0]->connect(); });
    rank1 = std::make_unique<raw_peer>(ts[0]->listen_port());
    REQUIRE(dial(*rank1, {.epoch = 1, .dialer = 1, .acceptor = 0, .world = 2}, job_token, epoch_nonce) ==
            handshake_status::ok);
    REQUIRE(connecting.wait_for(fails_within) == std::future_status::ready);
    connecting.get();
  }
};

/// What a pending receive of rank 0 fails with once rank 1 sends `frame_header` (and how long
/// that took); fails the test if it does not fail.
std::string receive_fails_after(rank0_and_raw_rank1& m, std::span<const std::byte> header, double& took_ms) {
  host_transport& t = *m.ts[0];
  auto receiving = std::async(std::launch::async, [&]() -> std::string {
    std::vector<std::byte> out(64);
    try {
      t.recv(1, 0, out);
    } catch (const transport_error& e) {
      return e.what();
    }
    return "";
  });
  std::this_thread::sleep_for(20ms);  // posted (a frame arriving first fails it all the same)
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(m.rank1->send(header));
  const bool failed = receiving.wait_for(fails_within) == std::future_status::ready;
  took_ms = ms_since(sent);
  if (!failed) t.abort("the test gives up");
  const std::string what = receiving.get();
  REQUIRE_MESSAGE(failed, "the receive still waits " << fails_within.count() << " ms after the bad frame");
  return what;
}

}  // namespace

TEST_CASE("a frame larger than the epoch carries closes the data plane instead of being allocated") {
  // 2^38 bytes: what the transport used to accept and try to allocate for a frame nobody waits for.
  // Read by the I/O thread (the receive sleeps after 300 us) and by the receive itself, waiting
  // awake all along.
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(60'000'000)}) {
    CAPTURE(spin.count());
    rank0_and_raw_rank1 m(std::uint64_t{1} << 20, spin);
    const std::uint64_t huge = std::uint64_t{1} << 38;
    double took_ms = 0;
    const std::string what = receive_fails_after(m, frame_header(channel::p2p, 9, huge), took_ms);
    CAPTURE(what);
    CHECK(what.find("peer 1 broke the data-plane protocol") != std::string::npos);
    CHECK(what.find(std::to_string(huge)) != std::string::npos);
    CHECK(m.rank1->closed_within(fails_within));  // the link is closed
    CHECK(m.ts[0]->aborted());                    // and the epoch's data plane with it
    MESSAGE("the oversized frame failed the pending receive in " << took_ms << " ms");
    // Every later operation fails with the same reason.
    std::vector<std::byte> out(8);
    CHECK_THROWS_WITH_AS(m.ts[0]->recv(1, 1, out), doctest::Contains("broke the data-plane protocol"), transport_error);
  }
}

TEST_CASE("a frame just above the configured bound is refused, one at it is delivered") {
  constexpr std::uint64_t bound = 4096;
  {
    rank0_and_raw_rank1 m(bound);
    REQUIRE(m.rank1->send(frame_header(channel::p2p, 3, bound)));
    const auto body = pattern(bound, 1);
    REQUIRE(m.rank1->send(body));
    std::vector<std::byte> out(bound);
    m.ts[0]->recv(1, 3, out);
    CHECK(out == body);
  }
  rank0_and_raw_rank1 m(bound);
  double took_ms = 0;
  const std::string what = receive_fails_after(m, frame_header(channel::p2p, 3, bound + 1), took_ms);
  CHECK(what.find("more than the largest this epoch carries (4096 bytes)") != std::string::npos);
}

TEST_CASE("a frame of no known kind closes the data plane") {
  for (const auto spin : {std::chrono::microseconds(300), std::chrono::microseconds(60'000'000)}) {
    CAPTURE(spin.count());
    rank0_and_raw_rank1 m(std::uint64_t{1} << 20, spin);
    double took_ms = 0;
    const std::string what = receive_fails_after(m, frame_header(static_cast<channel>(7), 0, 16), took_ms);
    CAPTURE(what);
    CHECK(what.find("frame of unknown kind 7") != std::string::npos);
    CHECK(m.ts[0]->aborted());
  }
}
