#include "runtime/link_profiler.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
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

link_measurement measure_loopback_link(int repeats, std::int64_t small_bytes, std::int64_t bulk_bytes,
                                       const std::function<void()>& op, std::chrono::microseconds hold,
                                       std::chrono::milliseconds op_budget) {
  if (repeats < 1 || small_bytes < 1 || bulk_bytes < small_bytes)
    throw std::invalid_argument("measure_loopback_link: need repeats >= 1 and 1 <= small_bytes <= bulk_bytes");
  if (hold.count() < 0 || op_budget.count() < 0)
    throw std::invalid_argument("measure_loopback_link: hold and op_budget must be >= 0");
  auto config = [hold](int rank) {
    transport_config c;
    c.rank = rank;
    c.spin_wait = hold;  // the receive falls asleep about when its message comes (see the header)
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
  constexpr std::uint32_t small_tag = 1, bulk_tag = 2, held_tag = 3;
  const int warmup = 3;
  using clock = std::chrono::steady_clock;
  // A held message: byte 0 says whether another one follows (1) or the measurement ends (0); bytes
  // 8-15 carry the echo's send time (steady_clock ticks: one clock for both threads).
  using held_message = std::array<std::byte, 16>;
  const bool with_op = static_cast<bool>(op);
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
      for (held_message h{}; with_op;) {
        b.recv(0, held_tag, h);
        if (h[0] == std::byte{0}) break;
        std::this_thread::sleep_for(hold);  // the other side's thread blocks in its receive meanwhile
        const std::int64_t sent = clock::now().time_since_epoch().count();
        std::memcpy(h.data() + 8, &sent, sizeof sent);
        b.send(0, held_tag, h);
      }
    } catch (...) {
      echo_error = std::current_exception();
      b.abort("link measurement failed");
    }
  });
  link_measurement m;
  m.small_bytes = small_bytes;
  m.bulk_bytes = bulk_bytes;
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
    if (with_op) {
      const auto budget_end = clock::now() + op_budget;
      held_message h{};
      for (int i = 0; i < warmup + repeats; ++i) {
        if (i >= warmup + 3 && clock::now() > budget_end) break;
        op();  // the op right after itself: the second of two
        const auto start = clock::now();
        op();
        const double alone = ms_since(start);
        h[0] = std::byte{1};
        a.send(1, held_tag, h);
        a.recv(1, held_tag, h);
        op();  // as soon as the message is in, as a stage's op after its receive
        const auto end = clock::now();
        std::int64_t sent = 0;
        std::memcpy(&sent, h.data() + 8, sizeof sent);
        if (i < warmup) continue;
        m.op_ms.push_back(alone);
        m.waited_ms.push_back(std::chrono::duration<double, std::milli>(end - clock::time_point(clock::duration(sent))).count());
      }
      h[0] = std::byte{0};
      a.send(1, held_tag, h);
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
  m.idle_latency_ms = round_trip / 2;
  m.link.latency_ms = m.idle_latency_ms;
  if (!m.waited_ms.empty())  // what a stage that waited for its input sees, its op's cold start included
    m.link.latency_ms = std::max(m.idle_latency_ms, median(m.waited_ms) - median(m.op_ms));
  // The bulk message's own time: what one way of it took beyond a small message's round trip.
  const double transfer = std::max(median(m.bulk_ms) - round_trip, 1e-6);
  m.link.bytes_per_ms = static_cast<double>(bulk_bytes - small_bytes) / transfer;
  return m;
}

}  // namespace oobleck::runtime
