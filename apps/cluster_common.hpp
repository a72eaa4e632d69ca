#pragma once
// What the cluster programs (oobleck-coordinator, oobleck-worker, oobleck-ctl) share: addresses,
// the CAF configuration, and asking the coordinator as an operator.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <chrono>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::apps {

struct host_port {
  std::string host;
  std::uint16_t port = 0;
};

/// A TCP port this process holds for its data plane for as long as the object lives: a socket
/// bound to it on every address with SO_REUSEADDR, never listening. The data plane's listener
/// (SO_REUSEADDR too) binds the port at each epoch beside it, while no other process can take it:
/// the kernel hands out neither this port to another bind(0) nor it as a connection's local port.
/// (A port that was merely free when asked was free for the next worker too: two workers started
/// together were given the same one, and one of them could never form an epoch.)
class port_reservation {
 public:
  /// A free port, reserved; throws std::runtime_error if the kernel has none.
  port_reservation();
  ~port_reservation();
  port_reservation(port_reservation&& other) noexcept;
  port_reservation& operator=(port_reservation&&) = delete;
  port_reservation(const port_reservation&) = delete;
  port_reservation& operator=(const port_reservation&) = delete;
  [[nodiscard]] std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// "HOST:PORT" (PORT may be 0 where `allow_zero`); throws messages::input_error naming `flag`.
host_port parse_host_port(const std::string& flag, const std::string& text, bool allow_zero = false);

/// The CAF configuration of every cluster program: the protocol's types, the middleman, quiet
/// logs, a small scheduler that sleeps when idle (the machine's cores belong to LibTorch): CAF's
/// default work-stealing workers poll for ~25 ms after every message, and with a few control
/// messages per step that polling took a worker's compute down to 0.7x on a machine whose cores
/// are all in use (bench/RESULTS.md, "Failure-free throughput"); incoming messages deserialized
/// by the middleman's thread itself (no BASP worker: one thread less to wake per message).
struct cluster_config : caf::actor_system_config {
  cluster_config();
  /// CAF's middleman heartbeat: every connection carries a heartbeat each `interval_ms`, and a
  /// connection silent for `timeout_ms` is closed, so a hung process or a cut link becomes a
  /// down message like a crash. Call before the actor system is built.
  void set_heartbeat(int interval_ms, int timeout_ms);
};

/// A progress line: "[who] text", flushed at once (other processes interleave with it).
std::function<void(const std::string&)> progress_printer(std::string who);

/// Whether a TCP connection to `at` opens within `wait` (then it is closed at once).
///
/// CAF 0.17's middleman connects with a blocking connect() on its own thread, and serves the
/// process's connection requests one at a time. To an address that drops packets (a coordinator
/// cut off, its host frozen or gone from a routed network) that connect() waits for SYN
/// retransmissions, up to about two minutes, and every later request waits behind it: a worker
/// looking for its lost coordinator would not reach it again until the kernel's next
/// retransmission after the network heals (seconds to a minute later, past the grace period).
/// So a worker asks the middleman only once a connection of its own opened: it waits at most
/// `wait` here, without blocking anyone else.
bool tcp_reachable(const host_port& at, std::chrono::milliseconds wait);

/// One attempt to reach a coordinator at `at`, waiting at most `wait` (a worker looking for a
/// replacement of the coordinator it lost): nullopt when none answered.
std::optional<messages::coordinator_actor> try_coordinator(caf::actor_system& sys, const host_port& at,
                                                           std::chrono::milliseconds wait);

/// The first coordinator of `addresses` (a coordinator and its standbys) that completes CAF's
/// handshake, each tried in turn until `deadline`: one address for up to 10 s a try, several for
/// up to 1 s each, and then only once a TCP connection of its own opened there (tcp_reachable: an
/// address that drops packets must not hold up the next). A coordinator that closes the handshake,
/// greets in the clear, or (one address) stays silent through it twice in a row speaks another way
/// (TLS on one side only): messages::input_error says so. Once, it may have gone away during it
/// (killed, or frozen then replaced): tried again. Silence at one of several addresses is tried
/// again until the deadline and then named the same way. Else apps::unavailable naming the
/// addresses and `within`. `log` hears once that none answered yet. Over TLS when the system has
/// CAF's OpenSSL module (apps::use_tls).
messages::coordinator_actor connect_first_coordinator(caf::actor_system& sys, const std::vector<host_port>& addresses,
                                                      std::chrono::steady_clock::time_point deadline,
                                                      const std::string& within,
                                                      const std::function<void(const std::string&)>& log);

/// "12.5": seconds as a user reads them.
std::string seconds_text(double s);

/// Publishes the coordinator on `at` (port 0: any free one), over TLS when the system has CAF's
/// OpenSSL module; returns the port or CAF's error.
caf::expected<std::uint16_t> publish_coordinator(caf::actor_system& sys, const messages::coordinator_actor& c,
                                                 const host_port& at);

/// A fresh control proof: asks for a nonce and signs it with the token.
messages::control_proof operator_proof(caf::actor_system& sys, const messages::coordinator_actor& c,
                                       const std::string& token);

}  // namespace oobleck::apps
