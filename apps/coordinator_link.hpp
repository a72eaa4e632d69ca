#pragma once
// A worker's CAF connection to its coordinator, when CAF 0.17 leaves it unusable.
//
// CAF 0.17 names a connection by its socket number, which the kernel reuses, and the coordinator's
// middleman forgets a closed connection later, through its message queue. When a worker's
// connection ends and the worker connects again at once, the new connection can take the old
// one's number on the coordinator's side before that happens; forgetting the old one then removes
// the new one's route. The coordinator still receives the worker's requests over it, but with no
// sender (seen in `cluster: a hung worker is replaced ...`: nonce_request from a null sender),
// so no reply ever comes, and every new attempt reuses the same connection: the worker waited out
// its whole grace period. The usual trigger is a worker waking from a hang: its middleman's
// overdue heartbeat check closes its first new connection within a millisecond, still in its
// handshake (a connection's last activity starts at zero until the peer's handshake arrives).
//
// The worker therefore (1) waits handshake_retry_wait after a connection that reached a listener
// but failed its handshake (short: a replacement coordinator is met the same way, and every
// millisecond here is downtime), and (2) when a request over a connection that completed its
// handshake gets no answer at all, closes its end of the connection (shut_down_connections_to) and
// connects afresh after coordinator_link_settle (actors/monitor.hpp, drop_coordinator_link).

#include <chrono>
#include <cstddef>

#include "apps/cluster_common.hpp"

namespace oobleck::apps {

/// How long a worker leaves the coordinator to see one of its connections end before it opens
/// the next (the coordinator's middleman forgets it within milliseconds when it is not loaded).
inline constexpr std::chrono::milliseconds coordinator_link_settle{500};
/// The same after a failed handshake: the race is rarer than the handshake failures a coordinator
/// restart brings (500 ms here doubled a kill -9's downtime, bench/RESULTS.md), and (2) catches it.
inline constexpr std::chrono::milliseconds handshake_retry_wait{100};

/// Shuts down (both directions; the descriptors stay open for their owner, CAF's multiplexer, to
/// close) every TCP connection of this process whose peer is `at` (its host resolved, every
/// address it has). Returns how many. Linux: the process's sockets are read from /proc/self/fd.
std::size_t shut_down_connections_to(const host_port& at);

/// Whether a TCP connection to `at` receives bytes within `wait` (the connect included) while this
/// side says nothing: a plain CAF port sends its handshake unasked, a TLS port waits for the
/// client's hello. False when nothing accepts the connection. Used to name why a TLS connection failed at once.
bool greets_in_clear(const host_port& at, std::chrono::milliseconds wait);

}  // namespace oobleck::apps
