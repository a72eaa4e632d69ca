#pragma once
// A raw TCP client for tests of servers that must survive hostile clients (the HTTP status
// endpoint, CAF's port): send arbitrary bytes, read what comes back until the peer closes or a
// deadline passes. Every wait has a deadline.

#include <chrono>
#include <cstdint>
#include <string>

namespace oobleck::testing {

struct tcp_exchange {
  std::string received;
  bool closed_by_peer = false;  ///< end of stream or reset, before the deadline
  bool reset = false;           ///< the peer reset the connection
};

/// Connects to 127.0.0.1:port (throws std::runtime_error if it cannot).
class tcp_client {
 public:
  explicit tcp_client(std::uint16_t port);
  ~tcp_client();
  tcp_client(const tcp_client&) = delete;
  tcp_client& operator=(const tcp_client&) = delete;

  /// False when the peer closed the connection before it took every byte.
  bool send(const std::string& bytes);
  /// Reads until the peer closes or `timeout` passes.
  tcp_exchange read_until_closed(std::chrono::milliseconds timeout);
  /// Reads until `text` was received, the peer closes, or `timeout` passes.
  tcp_exchange read_until(const std::string& text, std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
};

/// One request on a fresh connection, the whole answer (the server closes after it unless it keeps
/// the connection alive: then whatever arrived within `timeout`).
tcp_exchange exchange(std::uint16_t port, const std::string& bytes,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// "GET path HTTP/1.1" with Connection: close; the whole response.
std::string http_get(std::uint16_t port, const std::string& path,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// The body of an HTTP response (after the blank line); empty when there is none.
std::string http_body(const std::string& response);

}  // namespace oobleck::testing
