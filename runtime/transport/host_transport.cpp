// Lifecycle of a transport: listening, connect(), abort(), destruction, and the error helpers.

#include "runtime/transport/host_transport.hpp"

#include <cstring>
#include <sstream>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

transport_error::transport_error(transport_failure kind, int peer, const std::string& what)
    : std::runtime_error(what), kind_(kind), peer_(peer) {}

// Explicit little-endian so the wire format does not depend on the hosts.
void put_u32(std::byte* at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t get_u32(const std::byte* at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(at[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::byte* at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  return v;
}

std::string describe_group(std::span<const int> group) {
  std::ostringstream out;
  out << '{';
  for (std::size_t i = 0; i < group.size(); ++i) out << (i ? "," : "") << group[i];
  out << '}';
  return out.str();
}

namespace {

void validate(const transport_config& c) {
  if (c.peers.empty()) throw std::invalid_argument("transport_config: no peers");
  if (c.rank < 0 || c.rank >= static_cast<int>(c.peers.size()))
    throw std::invalid_argument("transport_config: rank " + std::to_string(c.rank) +
                                " outside 0.." + std::to_string(c.peers.size() - 1));
}

tcp::endpoint resolve(asio::io_context& io, const peer_endpoint& p, int rank, bool passive) {
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto flags = passive ? tcp::resolver::passive : tcp::resolver::flags{};
  auto results = resolver.resolve(p.host, std::to_string(p.port), flags, ec);
  if (ec || results.empty())
    throw transport_error(transport_failure::connect_failed, rank,
                          "cannot resolve " + p.host + ":" + std::to_string(p.port) + " (rank " +
                              std::to_string(rank) + "): " + ec.message());
  return results.begin()->endpoint();
}

}  // namespace

host_transport::state::state(transport_config c)
    : config(std::move(c)),
      world(static_cast<int>(config.peers.size())),
      work(asio::make_work_guard(io)),
      acceptor(io),
      pool(buffer_pool::create(config.buffer_cache_bytes)),
      links(static_cast<std::size_t>(world)) {
  const peer_endpoint& self = config.peers[static_cast<std::size_t>(config.rank)];
  tcp::endpoint at = resolve(io, self, config.rank, true);
  boost::system::error_code ec;
  acceptor.open(at.protocol(), ec);
  // SO_REUSEADDR: the next epoch rebinds this port while old connections sit in TIME_WAIT.
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw transport_error(transport_failure::connect_failed, config.rank,
                          "rank " + std::to_string(config.rank) + " cannot listen on " + self.host +
                              ":" + std::to_string(self.port) + ": " + ec.message());
  bound_port = acceptor.local_endpoint().port();
  io_thread = std::thread([this] {
    // Handlers do not throw by design; if one does, the transport must not die silently with
    // threads blocked on it, so the error aborts the epoch and the loop keeps draining.
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          is_aborted = true;
          if (abort_reason.empty()) abort_reason = std::string("internal error: ") + e.what();
        }
        cv.notify_all();
        close_all();
      }
    }
  });
}

void host_transport::state::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu);
    if (!is_aborted) {
      is_aborted = true;
      abort_reason = reason;
    }
  }
  // Waiters that the I/O thread has not claimed wake up and throw now; claimed ones are
  // completed by the I/O thread once close_all() makes their socket operations fail.
  cv.notify_all();
  if (io.get_executor().running_in_this_thread()) {
    close_all();
    return;
  }
  asio::post(io, [this] { close_all(); });
  std::unique_lock lock(mu);
  cv.wait(lock, [this] { return sockets_closed; });
}

void host_transport::state::close_all() {
  if (io_closed) return;
  io_closed = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  for (auto& h : handshakes)
    if (auto alive = h.lock()) alive->socket.close(ignored);
  handshakes.clear();
  // Pieces nobody will write; released after the lock, since a keep-alive's deleter may run
  // caller code.
  std::vector<std::deque<outgoing>> dropped(links.size());
  std::vector<char> defer_close(links.size(), 0);
  {
    std::lock_guard lock(mu);
    for (std::size_t p = 0; p < links.size(); ++p) {
      link& l = links[p];
      dropped[p].swap(l.outbox);
      if (!l.broken) {
        l.broken = true;
        l.failure = transport_failure::aborted;
        l.failure_reason = abort_reason;
      }
      l.user_fd = -1;
      // A thread writing to the descriptor keeps it open until it is done (no reuse under it).
      defer_close[p] = l.caller_writing;
      if (l.caller_writing) l.close_deferred = true;
    }
  }
  for (std::size_t p = 0; p < links.size(); ++p) {
    link& l = links[p];
    if (l.retry_timer) l.retry_timer->cancel();
    if (l.socket) {
      l.socket->shutdown(tcp::socket::shutdown_both, ignored);
      if (defer_close[p])
        l.socket->cancel(ignored);
      else
        l.socket->close(ignored);  // pending waits complete with an error and stop
    }
    l.fd = -1;
  }
  // Receives being read into fail now, with the link's failure, and every piece that will not
  // be written is released before abort() returns (a zero-copy sender's buffer is free then).
  for (auto& l : links) drop_link_io(l);
  dropped.clear();
  {
    std::lock_guard lock(mu);
    sockets_closed = true;
  }
  cv.notify_all();
}

void host_transport::state::check_peer(const std::string& op, int peer) const {
  if (peer < 0 || peer >= world || peer == config.rank)
    throw std::invalid_argument(op + ": peer " + std::to_string(peer) +
                                " is not another rank of 0.." + std::to_string(world - 1));
}

void host_transport::state::throw_link_failure(const std::string& op, int peer) const {
  const link& l = links[static_cast<std::size_t>(peer)];
  if (is_aborted) throw transport_error(transport_failure::aborted, -1, op + ": " + abort_reason);
  throw transport_error(l.failure, peer, op + ": " + l.failure_reason);
}

void host_transport::state::throw_if_failed(std::unique_lock<std::mutex>&, const std::string& op,
                                            std::span<const int> peers) const {
  if (is_aborted) throw transport_error(transport_failure::aborted, -1, op + ": " + abort_reason);
  for (int p : peers) {
    if (p == config.rank) continue;
    const link& l = links[static_cast<std::size_t>(p)];
    if (l.broken) throw_link_failure(op, p);
    if (!l.up) throw std::logic_error(op + ": the transport is not connected (call connect())");
  }
}

host_transport::host_transport(transport_config config) {
  validate(config);
  state_ = std::make_unique<state>(std::move(config));
}

host_transport::~host_transport() {
  state_->abort("the transport was destroyed");
  state_->work.reset();
  state_->io_thread.join();
}

std::uint16_t host_transport::listen_port() const { return state_->bound_port; }
int host_transport::rank() const { return state_->config.rank; }
int host_transport::world_size() const { return state_->world; }
std::uint64_t host_transport::epoch() const { return state_->config.epoch; }

bool host_transport::aborted() const {
  std::lock_guard lock(state_->mu);
  return state_->is_aborted;
}

void host_transport::abort(const std::string& reason) { state_->abort(reason); }

void host_transport::connect(std::vector<peer_endpoint> peers) {
  if (peers.size() != state_->config.peers.size())
    throw std::invalid_argument("connect: " + std::to_string(peers.size()) + " endpoints for " +
                                std::to_string(state_->world) + " ranks");
  {
    // The I/O thread reads the endpoints once connecting has started.
    std::lock_guard lock(state_->mu);
    if (state_->connect_started) throw std::logic_error("connect: called twice");
  }
  state_->config.peers = std::move(peers);
  connect();
}

void host_transport::connect() {
  state& s = *state_;
  {
    std::lock_guard lock(s.mu);
    if (s.connect_started) throw std::logic_error("connect: called twice");
    if (s.is_aborted)
      throw transport_error(transport_failure::aborted, -1, "connect: " + s.abort_reason);
    s.connect_started = true;
  }
  const auto deadline = std::chrono::steady_clock::now() + s.config.connect_timeout;
  const int me = s.config.rank;
  s.endpoints.resize(static_cast<std::size_t>(s.world));
  try {
    for (int p = 0; p < me; ++p)
      s.endpoints[static_cast<std::size_t>(p)] =
          resolve(s.io, s.config.peers[static_cast<std::size_t>(p)], p, false);
  } catch (const transport_error& e) {
    s.abort(e.what());
    throw;
  }
  // Lower ranks accept, higher ranks connect: exactly one connection per pair.
  asio::post(s.io, [&s, me] {
    if (s.io_closed) return;
    if (me + 1 < s.world) {
      s.start_accept();
    } else {
      boost::system::error_code ignored;
      s.acceptor.close(ignored);
    }
    for (int p = 0; p < me; ++p) s.start_connect(p);
  });

  std::unique_lock lock(s.mu);
  const bool complete =
      s.cv.wait_until(lock, deadline, [&s] { return s.is_aborted || s.links_up == s.world - 1; });
  if (s.is_aborted && s.links_up < s.world - 1)
    throw transport_error(transport_failure::aborted, -1, "connect: " + s.abort_reason);
  if (complete) return;

  std::ostringstream why;
  why << "connect: rank " << me << " (epoch " << s.config.epoch << ") could not reach";
  int first_missing = -1;
  for (int p = 0; p < s.world; ++p) {
    const link& l = s.links[static_cast<std::size_t>(p)];
    if (p == me || l.up) continue;
    if (first_missing < 0) first_missing = p;
    const peer_endpoint& e = s.config.peers[static_cast<std::size_t>(p)];
    why << " peer " << p << " at " << e.host << ":" << e.port << " ("
        << (l.last_connect_error.empty() ? std::string(p < me ? "no answer" : "it never connected")
                                         : l.last_connect_error)
        << ");";
  }
  why << " within " << s.config.connect_timeout.count() << " ms";
  lock.unlock();
  s.abort(why.str());
  throw transport_error(transport_failure::connect_failed, first_missing, why.str());
}

}  // namespace oobleck::runtime
