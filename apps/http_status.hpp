#pragma once
// The coordinator's HTTP status endpoint (ARCHITECTURE.md §5): `GET /status` answers the JSON of
// `oobleck-ctl status --json`, `GET /metrics` the Prometheus text of the job's gauges, `GET /history`
// the run's history (run_history.hpp) and `GET /` the dashboard (dashboard.hpp: one self-contained
// HTML page that polls the two JSON paths); any other path is 404, any other method 405, a request
// that is not HTTP 400 (then the connection closes). It runs on a thread of its own (Boost.Asio and
// Beast; no Boost in this header) and gets each status from a status_source, which asks the
// coordinator actor without blocking that thread, and each history from a history_source.
//
// A hostile or slow client holds little: a request must arrive whole within read_timeout and fit
// max_request_bytes, and at most max_connections are open at once (further ones are closed at
// once). No authentication: bind it to an address only trusted scrapers reach.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "apps/status_report.hpp"

namespace oobleck::apps {

struct http_limits {
  std::chrono::milliseconds read_timeout{5000};    ///< for a whole request, from its first byte on
  std::chrono::milliseconds write_timeout{5000};   ///< for a whole response
  std::chrono::milliseconds status_timeout{5000};  ///< for the coordinator's answer, else 503
  std::size_t max_request_bytes = 8192;            ///< request line, headers and body together
  std::size_t max_connections = 64;
};

/// Where the server gets a status. Called on the server's thread; it must call `done` exactly
/// once, from any thread, without blocking the caller (request_status does).
using status_source = std::function<void(std::function<void(status_reply)> done)>;

/// Where the server gets the run's history (the JSON text of GET /history). Called on the server's
/// thread; it must call `done` exactly once, from any thread, without blocking the caller.
using history_source = std::function<void(std::function<void(std::string json)> done)>;

class http_status_server {
 public:
  /// Listens on host:port (port 0: any free port) at once, so that an address in use is an error
  /// before anything else starts; serves nothing before start(). Throws messages::input_error
  /// "cannot serve HTTP on HOST:PORT: REASON".
  http_status_server(const std::string& host, std::uint16_t port, http_limits limits = {});
  /// Stops serving: open connections are closed, the thread is joined.
  ~http_status_server();
  http_status_server(const http_status_server&) = delete;
  http_status_server& operator=(const http_status_server&) = delete;

  /// The port it listens on (the bound one when constructed with port 0).
  [[nodiscard]] std::uint16_t port() const;
  /// Starts the server's thread: accepts and answers requests with statuses from `source` and
  /// histories from `history` (none: GET /history is 404, and the dashboard shows no curves).
  void start(status_source source, history_source history = {});

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace oobleck::apps
