#include "apps/coordinator_link.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace oobleck::apps {

namespace {

/// Same family, address and port (IPv4 or IPv6).
bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

struct endpoint {
  sockaddr_storage address{};
  socklen_t len = 0;
};

/// Every TCP address `at` resolves to (none when it does not resolve).
std::vector<endpoint> resolve(const host_port& at) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0) return {};
  std::vector<endpoint> out;
  for (auto* a = found; a; a = a->ai_next) {
    endpoint e;
    e.len = static_cast<socklen_t>(std::min<std::size_t>(a->ai_addrlen, sizeof e.address));
    std::memcpy(&e.address, a->ai_addr, e.len);
    out.push_back(e);
  }
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

std::size_t shut_down_connections_to(const host_port& at) {
  const auto targets = resolve(at);
  if (targets.empty()) return 0;
  std::size_t shut = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const auto name = entry.path().filename().string();
    int fd = -1;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc{}) continue;
    int type = 0;
    socklen_t type_len = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    for (const auto& t : targets)
      if (same_endpoint(peer, t.address)) {
        if (::shutdown(fd, SHUT_RDWR) == 0) ++shut;
        break;
      }
  }
  return shut;
}

bool greets_in_clear(const host_port& at, std::chrono::milliseconds wait) {
  // Non-blocking: `wait` bounds the connect too (an unreachable host would otherwise hold this for
  // the kernel's SYN retries, minutes).
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const auto ready = [&](int fd, short events) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0))) == 1 && (p.revents & events);
  };
  for (const auto& e : resolve(at)) {
    const int fd = ::socket(e.address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    bool greeted = false;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&e.address), e.len) == 0 || errno == EINPROGRESS) {
      int error = 0;
      socklen_t error_len = sizeof error;
      char byte = 0;
      greeted = ready(fd, POLLOUT) && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_len) == 0 && error == 0 &&
                ready(fd, POLLIN) && ::recv(fd, &byte, 1, 0) == 1;
    }
    ::close(fd);
    if (greeted) return true;
  }
  return false;
}

}  // namespace oobleck::apps
