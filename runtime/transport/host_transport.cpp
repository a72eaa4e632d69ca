// Lifecycle of a transport (listening, abort(), destruction), the error helpers, and the
// point-to-point calls.

#include "runtime/transport/host_transport.hpp"

#include <deque>
#include <sstream>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

transport_error::transport_error(transport_failure kind, int peer, const std::string& what)
    : std::runtime_error(what), kind_(kind), peer_(peer) {}

std::string describe_group(std::span<const int> group) {
  std::ostringstream out;
  out << '{';
  for (std::size_t i = 0; i < group.size(); ++i) out << (i ? "," : "") << group[i];
  out << '}';
  return out.str();
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

namespace {

void validate(const transport_config& c) {
  if (c.peers.empty()) throw std::invalid_argument("transport_config: no peers");
  if (c.rank < 0 || c.rank >= static_cast<int>(c.peers.size()))
    throw std::invalid_argument("transport_config: rank " + std::to_string(c.rank) +
                                " outside 0.." + std::to_string(c.peers.size() - 1));
  if (c.max_frame_bytes == 0) throw std::invalid_argument("transport_config: max_frame_bytes is 0 (no frame could pass)");
}

std::string with_tag(const std::string& what, int peer, std::uint32_t tag) {
  return what + " peer " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

}  // namespace

host_transport::state::state(transport_config c)
    : config(std::move(c)),
      world(static_cast<int>(config.peers.size())),
      pool(buffer_pool::create(config.buffer_cache_bytes)),
      work(asio::make_work_guard(io)),
      io_only(io),
      links(static_cast<std::size_t>(world)) {
  const peer_endpoint& self = config.peers[static_cast<std::size_t>(config.rank)];
  tcp::endpoint at = resolve(io, self, config.rank, true);
  tcp::acceptor& acceptor = io_only.acceptor;  // no I/O thread yet
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
          auto lk = lock();
          transport_shared& sh = shared(lk);
          sh.is_aborted = true;
          if (sh.abort_reason.empty()) sh.abort_reason = std::string("internal error: ") + e.what();
        }
        cv.notify_all();
        close_all();
      }
    }
  });
}

void host_transport::state::abort(const std::string& reason) {
  {
    auto lk = lock();
    transport_shared& sh = shared(lk);
    if (!sh.is_aborted) {
      sh.is_aborted = true;
      sh.abort_reason = reason;
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
  auto lk = lock();
  lk.wait(cv, [&] { return shared(lk).sockets_closed; });
}

void host_transport::state::check_peer(const std::string& op, int peer) const {
  if (peer < 0 || peer >= world || peer == config.rank)
    throw std::invalid_argument(op + ": peer " + std::to_string(peer) +
                                " is not another rank of 0.." + std::to_string(world - 1));
}

void host_transport::state::throw_if_failed(const locked& lock, const std::string& op,
                                            std::span<const int> peers, bool require_up) const {
  const transport_shared& sh = shared(lock);
  if (sh.is_aborted)
    throw transport_error(transport_failure::aborted, -1, op + ": " + sh.abort_reason);
  for (int p : peers) {
    if (p == config.rank) continue;
    const link_shared& l = at(p).shared(lock);
    if (l.broken) throw transport_error(l.failure, p, op + ": " + l.failure_reason);
    if (!l.up && require_up) throw std::logic_error(op + ": the transport is not connected (call connect())");
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
std::uint64_t host_transport::waiting_reads() const { return state_->waiting_reads.load(); }

bool host_transport::aborted() const {
  auto lk = state_->lock();
  return state_->shared(lk).is_aborted;
}

void host_transport::abort(const std::string& reason) { state_->abort(reason); }

void host_transport::connect() { state_->connect(state_->config.peers); }

void host_transport::connect(std::vector<peer_endpoint> peers) {
  if (peers.size() != state_->config.peers.size())
    throw std::invalid_argument("connect: " + std::to_string(peers.size()) + " endpoints for " +
                                std::to_string(state_->world) + " ranks");
  state_->connect(peers);
}

void host_transport::wait_connected(int peer) { state_->wait_connected(peer); }

void host_transport::send(int peer, std::uint32_t tag, std::span<const std::byte> bytes) {
  const std::string op = with_tag("send to", peer, tag);
  state_->check_peer(op, peer);
  state_->post_copy(op, peer, frame_key(channel::p2p, tag), bytes);
}

void host_transport::send(int peer, std::uint32_t tag, std::span<const std::byte> bytes,
                          std::shared_ptr<const void> keep_alive) {
  const std::string op = with_tag("send to", peer, tag);
  state_->check_peer(op, peer);
  state_->post_frame(op, peer, frame_key(channel::p2p, tag), bytes, std::move(keep_alive));
}

void host_transport::recv(int peer, std::uint32_t tag, std::span<std::byte> out) {
  const std::string op = with_tag("recv from", peer, tag);
  state_->check_peer(op, peer);
  recv_request req;
  req.out = out;
  req.direct = true;
  state_->wait_recv(op, peer, frame_key(channel::p2p, tag), req, {});
}

struct host_transport::posted_recv::impl {
  state* s = nullptr;
  int peer = 0;
  std::uint64_t key = 0;
  std::string op;
  recv_request req;
  bool finished = false;  ///< waited for (or delivered at posting, and waited for)
};

host_transport::posted_recv::posted_recv(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

host_transport::posted_recv::~posted_recv() {
  if (impl_ && !impl_->finished) impl_->s->cancel_recv(impl_->peer, impl_->key, impl_->req);
}

void host_transport::posted_recv::wait() {
  if (impl_->finished) throw std::logic_error(impl_->op + ": waited for twice");
  impl_->finished = true;  // whatever wait_posted does, nothing is left posted afterwards
  if (impl_->req.stage == recv_stage::done) return;  // it had arrived when it was posted
  impl_->s->wait_posted(impl_->op, impl_->peer, impl_->key, impl_->req, {});
}

std::unique_ptr<host_transport::posted_recv> host_transport::post_recv(int peer, std::uint32_t tag,
                                                                        std::span<std::byte> out) {
  auto p = std::make_unique<posted_recv::impl>();
  p->s = state_.get();
  p->peer = peer;
  p->key = frame_key(channel::p2p, tag);
  p->op = with_tag("recv from", peer, tag);
  state_->check_peer(p->op, peer);
  p->req.out = out;
  p->req.direct = true;
  state_->post_recv(p->op, peer, p->key, p->req, {});
  return std::unique_ptr<posted_recv>(new posted_recv(std::move(p)));
}

void host_transport::recv_all(std::span<const recv_item> items, const std::function<void(std::size_t)>& done,
                              const std::function<void()>& posted) {
  state& s = *state_;
  std::vector<std::string> ops;
  ops.reserve(items.size());
  for (const recv_item& it : items) {
    ops.push_back(with_tag("recv from", it.peer, it.tag));
    s.check_peer(ops.back(), it.peer);
  }
  std::deque<recv_request> reqs;  // stable addresses: the mailboxes point at them
  std::size_t waited = 0;
  // On the way out, normal or not, nothing may stay queued or be read into an item's bytes.
  struct cancel_receives {
    state& s;
    std::span<const recv_item> items;
    std::deque<recv_request>& reqs;
    const std::size_t& waited;
    ~cancel_receives() {
      for (std::size_t i = waited; i < reqs.size(); ++i)
        s.cancel_recv(items[i].peer, frame_key(channel::p2p, items[i].tag), reqs[i]);
    }
  };
  const cancel_receives cancel{s, items, reqs, waited};
  for (const recv_item& it : items) {
    recv_request& req = reqs.emplace_back();
    req.out = it.out;
    req.direct = true;
    req.early = true;
    s.post_recv(ops[reqs.size() - 1], it.peer, frame_key(channel::p2p, it.tag), req, {});
  }
  if (posted) posted();
  for (std::size_t i = 0; i < items.size(); ++i) {
    s.wait_posted(ops[i], items[i].peer, frame_key(channel::p2p, items[i].tag), reqs[i], {});
    waited = i + 1;
    if (done) done(i);
  }
}

}  // namespace oobleck::runtime
