#pragma once
// A raw TCP connection to a transport's port, for tests that play a stranger (no key, a replayed
// or forged handshake) or a broken peer (the key, then frames no real rank sends). Blocking
// POSIX sockets with deadlines; no Asio, so nothing of the transport under test is reused.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/transport/transport_handshake.hpp"
#include "runtime/transport/transport_wire.hpp"

namespace oobleck::runtime::transport_testing {

class raw_peer {
 public:
  /// Connects to 127.0.0.1:port.
  explicit raw_peer(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error("raw_peer: socket failed");
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
      ::close(fd_);
      throw std::runtime_error("raw_peer: cannot connect to port " + std::to_string(port));
    }
  }
  /// Adopts an accepted socket.
  struct adopt_t {};
  raw_peer(adopt_t, int fd) : fd_(fd) {}
  ~raw_peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_peer(const raw_peer&) = delete;
  raw_peer& operator=(const raw_peer&) = delete;

  /// Writes every byte; false if the other side is gone.
  bool send(std::span<const std::byte> bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
  /// Fills `out`; false if the connection ended or `timeout` passed first.
  bool read(std::span<std::byte> out, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t done = 0;
    while (done < out.size()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t n = ::recv(fd_, out.data() + done, out.size() - done, 0);
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
  /// True once the other side has closed the connection (within `timeout`).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      std::byte sink[4096];
      const ssize_t n = ::recv(fd_, sink, sizeof sink, 0);
      if (n <= 0) return true;
    }
  }

 private:
  int fd_;
};

/// The acceptor's greeting: its challenge, after checking magic and version.
inline challenge_bytes read_greeting(raw_peer& p) {
  std::array<std::byte, greeting_size> g;
  if (!p.read(g)) throw std::runtime_error("raw_peer: no greeting from the acceptor");
  if (get_u32(g.data()) != handshake_magic || get_u32(g.data() + 4) != handshake_version)
    throw std::runtime_error("raw_peer: the greeting is not the transport's");
  challenge_bytes c;
  std::memcpy(c.data(), g.data() + 8, challenge_size);
  return c;
}

/// A dialer's hello for `claim`, answering `acceptor_challenge` with a proof under key and nonce.
inline std::array<std::byte, hello_size> make_hello(const link_claim& claim, const std::string& key,
                                                    const std::string& nonce, const challenge_bytes& acceptor_challenge) {
  std::array<std::byte, hello_size> h;
  const challenge_bytes mine = fresh_challenge();
  put_u32(h.data(), handshake_magic);
  put_u32(h.data() + 4, handshake_version);
  put_u64(h.data() + 8, claim.epoch);
  put_u32(h.data() + 16, static_cast<std::uint32_t>(claim.dialer));
  put_u32(h.data() + 20, static_cast<std::uint32_t>(claim.world));
  std::memcpy(h.data() + 24, mine.data(), challenge_size);
  const proof_bytes proof = link_proof(link_role::dialer, key, nonce, claim, acceptor_challenge, mine);
  std::memcpy(h.data() + 24 + challenge_size, proof.data(), proof_size);
  return h;
}

/// Plays the dialer's whole handshake; the acceptor's status, or nothing if it closed first.
inline std::optional<handshake_status> dial(raw_peer& p, const link_claim& claim, const std::string& key,
                                            const std::string& nonce) {
  const auto hello = make_hello(claim, key, nonce, read_greeting(p));
  if (!p.send(hello)) return std::nullopt;
  std::array<std::byte, ack_size> ack;
  if (!p.read(ack)) return std::nullopt;
  return static_cast<handshake_status>(get_u32(ack.data() + 4));
}

/// A frame header: channel, tag, body length.
inline std::array<std::byte, frame_header_size> frame_header(channel c, std::uint32_t tag, std::uint64_t size) {
  std::array<std::byte, frame_header_size> h;
  put_u64(h.data(), frame_key(c, tag));
  put_u64(h.data() + 8, size);
  return h;
}

}  // namespace oobleck::runtime::transport_testing
