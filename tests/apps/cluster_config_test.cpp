// The CAF configuration every cluster program runs with, and the data port a worker holds.

#include "apps/cluster_common.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <vector>

#include <caf/config_value.hpp>

using namespace oobleck::apps;

TEST_CASE("cluster programs run CAF's scheduler with workers that sleep when idle, no BASP workers, and heartbeats as set") {
  cluster_config cfg;
  // CAF's default (work stealing) polls for ~25 ms after every message: with a few control
  // messages per step that took the compute of 2 workers on 2 cores down to 0.7x.
  CHECK(caf::get_or(cfg, "scheduler.policy", caf::atom("stealing")) == caf::atom("sharing"));
  CHECK(caf::get_or(cfg, "scheduler.max-threads", std::size_t{0}) == 2);
  // No BASP worker: the middleman's thread deserializes what arrives (one wake-up less a message).
  CHECK(caf::get_or(cfg, "middleman.workers", std::size_t{1}) == 0);
  cfg.set_heartbeat(250, 1500);
  CHECK(caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0}) == std::chrono::milliseconds(250));
  CHECK(caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0}) == std::chrono::milliseconds(1500));
  // The system starts with it (an unknown policy would fall back silently in CAF 0.17).
  caf::actor_system sys{cfg};
  CHECK(sys.scheduler().num_workers() == 2);
}

namespace {

/// bind() of 127.0.0.1:port on a fresh socket, with or without SO_REUSEADDR, then listen().
int bind_and_listen(std::uint16_t port, bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  const int on = 1;
  if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? ::listen(fd, 4) : -1;
  const int error = errno;
  ::close(fd);
  return rc == 0 ? 0 : error;
}

}  // namespace

// Was a bug (fixed): a worker chose its data port as "free now" (bind to port 0, close) and
// advertised it; two workers started together were given the same port, and the second could
// never listen on it ("rank 2 cannot listen on 127.0.0.1:36863: Address already in use", in the
// checkpoint e2e test under CI's load). A reservation keeps the port bound for the worker's life.
TEST_CASE("a reserved data port is the worker's alone, and its data plane can listen on it every epoch") {
  std::optional<port_reservation> r;
  r.emplace();
  const auto port = r->port();
  CHECK(port != 0);
  // Anyone else (bind without SO_REUSEADDR, as bind(0) and connect() choose ports) is refused...
  CHECK(bind_and_listen(port, false) == EADDRINUSE);
  // ...while the data plane's listener (SO_REUSEADDR, as the transport's acceptor) binds it,
  // again and again (one listener per epoch).
  CHECK(bind_and_listen(port, true) == 0);
  CHECK(bind_and_listen(port, true) == 0);
  // Other reservations held at the same time get other ports.
  std::vector<port_reservation> others;
  for (int i = 0; i < 50; ++i) {
    others.emplace_back();
    CHECK(others.back().port() != port);
  }
  // Released with the reservation.
  r.reset();
  CHECK(bind_and_listen(port, false) == 0);
}
