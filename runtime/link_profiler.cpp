#include "runtime/link_profiler.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "runtime/median.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime {

planning::link_profile with_staging(planning::link_profile link, double staging_bytes_per_ms) {
  if (!(staging_bytes_per_ms > 0)) throw std::invalid_argument("with_staging: the staging rate must be > 0");
  link.bytes_per_ms =
      link.bytes_per_ms > 0 ? 1.0 / (1.0 / link.bytes_per_ms + 1.0 / staging_bytes_per_ms) : staging_bytes_per_ms;
  return link;
}

link_measurement measure_loopback_link(int repeats, std::int64_t small_bytes, std::int64_t bulk_bytes) {
  if (repeats < 1 || small_bytes < 1 || bulk_bytes < small_bytes)
    throw std::invalid_argument("measure_loopback_link: need repeats >= 1 and 1 <= small_bytes <= bulk_bytes");
  auto config = [](int rank) {
    transport_config c;
    c.rank = rank;
    c.peers = {{"127.0.0.1", 0}, {"127.0.0.1", 0}};
    c.connect_timeout = std::chrono::seconds(10);
    return c;
  };
  host_transport a(config(0)), b(config(1));
  const std::vector<peer_endpoint> peers{{"127.0.0.1", a.listen_port()}, {"127.0.0.1", b.listen_port()}};
  {
    std::jthread other([&] { b.connect(peers); });
    a.connect(peers);
  }
  constexpr std::uint32_t small_tag = 1, bulk_tag = 2;
  const int warmup = 3;
  std::vector<std::byte> small(static_cast<std::size_t>(small_bytes)), bulk(static_cast<std::size_t>(bulk_bytes));
  std::exception_ptr echo_error;
  std::jthread echo([&] {
    std::vector<std::byte> s(small.size()), l(bulk.size());
    try {
      for (int i = 0; i < warmup + repeats; ++i) {
        b.recv(0, small_tag, s);
        b.send(0, small_tag, s);
      }
      for (int i = 0; i < warmup + repeats; ++i) {
        b.recv(0, bulk_tag, l);
        b.send(0, small_tag, s);
      }
    } catch (...) {
      echo_error = std::current_exception();
      b.abort("link measurement failed");
    }
  });
  link_measurement m;
  m.small_bytes = small_bytes;
  m.bulk_bytes = bulk_bytes;
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
  try {
    for (int i = 0; i < warmup + repeats; ++i) {
      const auto start = clock::now();
      a.send(1, small_tag, small);
      a.recv(1, small_tag, small);
      if (i >= warmup) m.round_trip_ms.push_back(ms_since(start));
    }
    for (int i = 0; i < warmup + repeats; ++i) {
      const auto start = clock::now();
      a.send(1, bulk_tag, bulk);
      a.recv(1, small_tag, small);
      if (i >= warmup) m.bulk_ms.push_back(ms_since(start));
    }
  } catch (...) {
    a.abort("link measurement failed");
    echo.join();
    if (echo_error) std::rethrow_exception(echo_error);
    throw;
  }
  echo.join();
  if (echo_error) std::rethrow_exception(echo_error);
  const double round_trip = median(m.round_trip_ms);
  m.link.latency_ms = round_trip / 2;
  // The bulk message's own time: what one way of it took beyond a small message's round trip.
  const double transfer = std::max(median(m.bulk_ms) - round_trip, 1e-6);
  m.link.bytes_per_ms = static_cast<double>(bulk_bytes - small_bytes) / transfer;
  return m;
}

}  // namespace oobleck::runtime
