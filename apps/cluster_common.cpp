#include "apps/cluster_common.hpp"

#include <cerrno>
#include <cstdlib>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <iostream>
#include <stdexcept>
#include <set>
#include <sstream>
#include <thread>

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "apps/coordinator_link.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

using messages::input_error;

port_reservation::port_reservation() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (fd_ < 0 || ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("cannot reserve a free TCP port for the data plane");
  }
  port_ = ntohs(a.sin_port);
}

port_reservation::~port_reservation() {
  if (fd_ >= 0) ::close(fd_);
}

port_reservation::port_reservation(port_reservation&& other) noexcept : fd_(other.fd_), port_(other.port_) {
  other.fd_ = -1;
}

host_port parse_host_port(const std::string& flag, const std::string& text, bool allow_zero) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw input_error(flag + ": expected HOST:PORT, got '" + text + "'");
  host_port hp;
  hp.host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc{} || end != port.data() + port.size() || value > 65535 ||
      (value == 0 && !allow_zero))
    throw input_error(flag + ": the port must be an integer in " + (allow_zero ? "0" : "1") +
                      "..65535, got '" + port + "'");
  hp.port = static_cast<std::uint16_t>(value);
  return hp;
}

cluster_config::cluster_config() {
  messages::add_protocol_types(*this);
  load<caf::io::middleman>();
  set("scheduler.max-threads", 2);
  set("scheduler.policy", caf::atom("sharing"));
  // Incoming messages are deserialized by the middleman's own thread, not handed to a BASP worker
  // (CAF 0.17.6 starts min(3, cores / 4) + 1 of them, each run as a job of the scheduler): the
  // hand-off is one more thread to wake per message, on the commit's and the replies' way between
  // two steps, and a step's few control messages are small (bench/RESULTS.md, "BASP workers").
  set("middleman.workers", std::size_t{0});
  set("logger.verbosity", caf::atom("quiet"));
  set("logger.console", caf::atom("none"));
}

void cluster_config::set_heartbeat(int interval_ms, int timeout_ms) {
  set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(interval_ms)});
  set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

std::function<void(const std::string&)> progress_printer(std::string who) {
  // OOBLECK_LOG_PREFIX goes before every line: log lines are for people, and the tests run with
  // one set to prove that no program or test learns what happened from them (events do that).
  const char* prefix = std::getenv("OOBLECK_LOG_PREFIX");
  return [who = std::move(who), prefix = std::string(prefix ? prefix : "")](const std::string& line) {
    std::cout << prefix << "[" << who << "] " << line << std::endl;
  };
}

bool tcp_reachable(const host_port& at, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0 || !found) return false;
  bool open = false;
  for (addrinfo* a = found; a && !open; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      open = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
             ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return open;
}

std::string seconds_text(double seconds) {
  std::ostringstream s;
  s << seconds;
  return s.str();
}

namespace {

/// One connection attempt through the middleman actor (TLS or not), waiting at most `wait`.
caf::expected<caf::strong_actor_ptr> connect_once(caf::actor_system& sys, const host_port& at,
                                                  std::chrono::milliseconds wait) {
  const caf::io::middleman_actor mm =
      sys.has_openssl_manager() ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  caf::scoped_actor self{sys};
  caf::expected<caf::strong_actor_ptr> result{caf::sec::cannot_connect_to_node};
  self->request(mm, wait, caf::connect_atom_v, at.host, at.port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
            if (!ptr)
              result = caf::make_error(caf::sec::no_actor_published_at_port);
            else if (!sys.assignable(ifs, sys.message_types(caf::detail::type_list<messages::coordinator_actor>{})))
              result = caf::make_error(caf::sec::unexpected_actor_messaging_interface);
            else
              result = std::move(ptr);
          },
          [&](caf::error& e) { result = std::move(e); });
  return result;
}

}  // namespace

std::optional<messages::coordinator_actor> try_coordinator(caf::actor_system& sys, const host_port& at,
                                                           std::chrono::milliseconds wait) {
  auto c = connect_once(sys, at, wait);
  if (!c) return std::nullopt;
  return caf::actor_cast<messages::coordinator_actor>(std::move(*c));
}

namespace {

/// What one connection attempt met: a coordinator, nothing listening (yet), a listener silent
/// through CAF's handshake (another way of speaking, or overloaded, frozen or unreachable), or one
/// that closed it or greeted in the clear (another way of speaking). `why` says it for a user.
struct attempt {
  enum class outcome { connected, nothing, silent, mismatch } kind;
  messages::coordinator_actor coordinator;
  std::string why;
};

attempt connect_attempt(caf::actor_system& sys, const host_port& at, std::chrono::milliseconds wait) {
  const std::string where = at.host + ":" + std::to_string(at.port);
  const bool tls = sys.has_openssl_manager();
  auto c = connect_once(sys, at, wait);
  if (c) return {attempt::outcome::connected, caf::actor_cast<messages::coordinator_actor>(std::move(*c)), ""};
  if (c.error() == caf::sec::request_timeout)
    return {attempt::outcome::silent, {},
            "the coordinator at " + where + " did not complete CAF's handshake within " +
                seconds_text(std::chrono::duration<double>(wait).count()) +
                " s: " +
                (tls ? "it runs without TLS, or is overloaded or unreachable"
                     : "if it runs with TLS, give --tls-certificate, --tls-key and --tls-ca-file (or a job "
                       "file's [tls]); else it is overloaded or unreachable")};
  if (c.error() == caf::sec::disconnect_during_handshake || c.error() == caf::sec::malformed_basp_message)
    return {attempt::outcome::mismatch, {},
            "the coordinator at " + where + " closed the connection during CAF's handshake (" + sys.render(c.error()) +
                ")" +
                (tls ? ": with TLS on here, it runs without TLS, or its CA did not sign this side's "
                       "certificate, or this side's CA did not sign its certificate (both sides must use "
                       "the job's CA)"
                     : ": it probably runs with TLS: give --tls-certificate, --tls-key and --tls-ca-file (or a "
                       "job file's [tls])")};
  // CAF's TLS connect starts its handshake the moment TCP connects: when a plain CAF port's
  // handshake has already arrived by then, the session fails at once and CAF says only
  // cannot_connect_to_node, as for a port nobody listens on. A port that greets in the clear
  // tells the two apart.
  if (tls && c.error() == caf::sec::cannot_connect_to_node && greets_in_clear(at, std::chrono::seconds(1)))
    return {attempt::outcome::mismatch, {},
            "the coordinator at " + where + " sent CAF's handshake in the clear: it runs without TLS, "
            "and this side has TLS on (both sides must use TLS with the job's CA, or neither)"};
  return {attempt::outcome::nothing, {}, sys.render(c.error())};
}

std::string listed(const std::vector<host_port>& addresses) {
  std::string out;
  for (const auto& a : addresses) out += (out.empty() ? "" : ",") + a.host + ":" + std::to_string(a.port);
  return out;
}

}  // namespace

messages::coordinator_actor connect_first_coordinator(caf::actor_system& sys, const std::vector<host_port>& addresses,
                                                      std::chrono::steady_clock::time_point deadline,
                                                      const std::string& within,
                                                      const std::function<void(const std::string&)>& log) {
  const auto left_s = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  };
  const bool one = addresses.size() == 1;
  // A CAF handshake takes milliseconds (a TLS one too): a peer that accepts and then stays silent
  // this long waits for something this side never sends (a TLS port met without TLS). One address
  // gets up to 10 s a try; several, 1 s each. Refused connections (nothing listens yet) fail at
  // once and are retried.
  const double most_s = one ? 10.0 : 1.0;
  std::vector<int> failures(addresses.size(), 0);
  std::string last_nothing, last_silent;
  bool said = false;
  for (;;) {
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const auto wait = std::chrono::milliseconds(static_cast<std::int64_t>(1000 * std::clamp(left_s(), 0.2, most_s)));
      auto a = one || tcp_reachable(addresses[i], wait)
                   ? connect_attempt(sys, addresses[i], wait)
                   : attempt{attempt::outcome::nothing, {}, "nothing accepted a TCP connection"};
      switch (a.kind) {
        case attempt::outcome::connected:
          return a.coordinator;
        case attempt::outcome::mismatch:
        case attempt::outcome::silent:
          // Twice in a row: it speaks another way. Once, it may have gone away during the
          // handshake (killed, or frozen then replaced). Several addresses' short waits leave
          // silence to the deadline (a busy coordinator may take more than 1 s).
          if (a.kind == attempt::outcome::silent && !one) {
            failures[i] = 0;
            last_silent = a.why;
          } else if (++failures[i] >= 2 || left_s() <= 0) {
            throw input_error(a.why);
          }
          break;
        case attempt::outcome::nothing:
          failures[i] = 0;
          last_nothing = a.why;
          break;
      }
    }
    if (left_s() <= 0) {
      if (!last_silent.empty()) throw input_error(last_silent);
      throw unavailable("cannot reach " + std::string(one ? "the" : "a") + " coordinator at " + listed(addresses) +
                        " within " + within + ": " + last_nothing);
    }
    if (!said) {
      log("waiting for " + std::string(one ? "the" : "a") + " coordinator at " + listed(addresses) + " (" +
          (last_nothing.empty() ? last_silent : last_nothing) + ")");
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(one ? 200 : 100));
  }
}

caf::expected<std::uint16_t> publish_coordinator(caf::actor_system& sys, const messages::coordinator_actor& c,
                                                 const host_port& at) {
  if (sys.has_openssl_manager()) return caf::openssl::publish(c, at.port, at.host.c_str(), true);
  return sys.middleman().publish(c, at.port, at.host.c_str(), true);
}

messages::control_proof operator_proof(caf::actor_system& sys, const messages::coordinator_actor& c,
                                       const std::string& token) {
  caf::scoped_actor self{sys};
  messages::control_proof proof;
  self->request(c, std::chrono::seconds(30), messages::nonce_request{messages::protocol_version})
      .receive(
          [&](std::string& nonce) {
            proof.nonce = nonce;
            proof.proof = actors::control_proof_of(token, nonce);
          },
          [&](caf::error& e) {
            throw std::runtime_error("the coordinator refused a nonce: " + messages::describe(e));
          });
  return proof;
}

}  // namespace oobleck::apps
