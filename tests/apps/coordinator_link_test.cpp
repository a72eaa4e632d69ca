// A worker closing its own connections to a coordinator's address (apps/coordinator_link.hpp), so
// that CAF connects afresh: only connections whose peer is that address, both directions.

#include "apps/coordinator_link.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>

using namespace oobleck::apps;

namespace {

/// A loopback listener on a free port.
struct listener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::uint16_t port = 0;
  listener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~listener() { ::close(fd); }
  int accept_one() const { return ::accept(fd, nullptr, nullptr); }
};

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

/// The peer of `fd` sees its end: a read returns 0 (within 2 s).
bool sees_end(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 2000) != 1) return false;
  char c = 0;
  return ::read(fd, &c, 1) == 0;
}

/// Nothing arrives on `fd` within 100 ms: the connection is still open.
bool still_open(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 100) == 0;
}

}  // namespace

TEST_CASE("coordinator link: the process's connections to the address are shut down, and no other") {
  listener coordinator, other;
  const int a = connect_to(coordinator.port), b = connect_to(coordinator.port), c = connect_to(other.port);
  const int a_peer = coordinator.accept_one(), b_peer = coordinator.accept_one(), c_peer = other.accept_one();
  REQUIRE(a_peer >= 0);
  REQUIRE(b_peer >= 0);
  REQUIRE(c_peer >= 0);
  // The accepted ends are this process's too, but their peers are the clients' ephemeral ports.
  CHECK(shut_down_connections_to({"127.0.0.1", coordinator.port}) == 2u);
  CHECK(sees_end(a_peer));
  CHECK(sees_end(b_peer));
  CHECK(still_open(c_peer));
  CHECK(still_open(a_peer) == false);
  // The descriptors stay open for their owner to close; a second call finds them shut, not gone.
  char byte = 'x';
  CHECK(::send(a, &byte, 1, MSG_NOSIGNAL) < 0);
  CHECK(::send(c, &byte, 1, MSG_NOSIGNAL) == 1);
  CHECK(::read(c_peer, &byte, 1) == 1);
  // A host name resolves; an address nothing connected to shuts nothing down.
  CHECK(shut_down_connections_to({"localhost", other.port}) == 1u);
  CHECK(sees_end(c_peer));
  CHECK(shut_down_connections_to({"127.0.0.1", 1}) == 0u);
  CHECK(shut_down_connections_to({"no-such-host.invalid", coordinator.port}) == 0u);
  for (int fd : {a, b, c, a_peer, b_peer, c_peer}) ::close(fd);
}

TEST_CASE("coordinator link: a port that greets in the clear is told from a silent one and from none") {
  listener greeter, silent;
  // A plain CAF port sends its handshake unasked; a TLS port waits for the client's hello.
  std::thread serve([&] {
    const int peer = greeter.accept_one();
    REQUIRE(peer >= 0);
    const char hello[] = "caf";
    CHECK(::send(peer, hello, sizeof hello, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof hello));
    char c = 0;
    static_cast<void>(::read(peer, &c, 1));  // until the prober closes
    ::close(peer);
  });
  CHECK(greets_in_clear({"127.0.0.1", greeter.port}, std::chrono::seconds(2)));
  serve.join();
  const auto started = std::chrono::steady_clock::now();
  CHECK_FALSE(greets_in_clear({"127.0.0.1", silent.port}, std::chrono::milliseconds(200)));
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(200));
  // Nothing listens on a port just closed: false at once.
  std::uint16_t closed = 0;
  {
    listener gone;
    closed = gone.port;
  }
  CHECK_FALSE(greets_in_clear({"127.0.0.1", closed}, std::chrono::seconds(2)));
  CHECK_FALSE(greets_in_clear({"no-such-host.invalid", 1}, std::chrono::milliseconds(100)));
}
