#include "support/tcp_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace oobleck::testing {

tcp_client::tcp_client(std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error("socket: " + std::string(std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port) + ": " + why);
  }
}

tcp_client::~tcp_client() { ::close(fd_); }

bool tcp_client::send(const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
    if (n < 0) throw std::runtime_error("send: " + std::string(std::strerror(errno)));
    done += static_cast<std::size_t>(n);
  }
  return true;
}

tcp_exchange tcp_client::read_until(const std::string& text, std::chrono::milliseconds timeout) {
  tcp_exchange r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (!text.empty() && r.received.find(text) != std::string::npos) return r;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return r;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return r;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      r.closed_by_peer = true;
      r.reset = n < 0;
      return r;
    }
    r.received.append(buf, static_cast<std::size_t>(n));
  }
}

tcp_exchange tcp_client::read_until_closed(std::chrono::milliseconds timeout) { return read_until("", timeout); }

tcp_exchange exchange(std::uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout) {
  tcp_client c(port);
  c.send(bytes);
  return c.read_until_closed(timeout);
}

std::string http_get(std::uint16_t port, const std::string& path, std::chrono::milliseconds timeout) {
  return exchange(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout)
      .received;
}

std::string http_body(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : response.substr(at + 4);
}

}  // namespace oobleck::testing
