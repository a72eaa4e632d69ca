#include "apps/coordinator_link.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
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

}  // namespace

std::size_t shut_down_connections_to(const host_port& at) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0) return 0;
  std::vector<sockaddr_storage> targets;
  for (auto* a = found; a; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, std::min<std::size_t>(a->ai_addrlen, sizeof s));
    targets.push_back(s);
  }
  ::freeaddrinfo(found);
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
      if (same_endpoint(peer, t)) {
        if (::shutdown(fd, SHUT_RDWR) == 0) ++shut;
        break;
      }
  }
  return shut;
}

bool greets_in_clear(const host_port& at, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0) return false;
  bool greeted = false;
  for (auto* a = found; a && !greeted; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      pollfd p{fd, POLLIN, 0};
      char byte = 0;
      greeted = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 && (p.revents & POLLIN) &&
                ::recv(fd, &byte, 1, 0) == 1;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return greeted;
}

}  // namespace oobleck::apps
