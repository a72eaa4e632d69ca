// Mesh set-up: each rank accepts the higher ranks and connects to the lower ones, and a
// handshake (transport_handshake.hpp) checks the epoch, so a straggler of another epoch can
// never join, and makes both ends prove the job's key, so a stranger can neither join nor take
// a rank from the real peer. connect() waits
// for the I/O thread to bring every link up, or gives up at its deadline.

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

void host_transport::state::connect(const std::vector<peer_endpoint>& peers) {
  {
    auto lk = lock();
    transport_shared& sh = shared(lk);
    if (sh.connect_started) throw std::logic_error("connect: called twice");
    if (sh.is_aborted)
      throw transport_error(transport_failure::aborted, -1, "connect: " + sh.abort_reason);
    sh.connect_started = true;
  }
  const auto deadline = std::chrono::steady_clock::now() + config.connect_timeout;
  const int me = config.rank;
  std::vector<tcp::endpoint> lower(static_cast<std::size_t>(world));
  try {
    for (int p = 0; p < me; ++p)
      lower[static_cast<std::size_t>(p)] =
          resolve(io, peers[static_cast<std::size_t>(p)], p, false);
  } catch (const transport_error& e) {
    abort(e.what());
    throw;
  }
  // Lower ranks accept, higher ranks connect: exactly one connection per pair.
  asio::post(io, [this, me, lower = std::move(lower)]() mutable {
    if (io_only.closed) return;
    io_only.endpoints = std::move(lower);
    if (me + 1 < world) {
      start_accept();
    } else {
      boost::system::error_code ignored;
      io_only.acceptor.close(ignored);
    }
    for (int p = 0; p < me; ++p) start_connect(p);
  });

  std::string why;
  int first_missing = -1;
  {
    auto lk = lock();
    const transport_shared& sh = shared(lk);
    const bool complete =
        lk.wait_until(cv, deadline, [&] { return sh.is_aborted || sh.links_up == world - 1; });
    if (sh.is_aborted && sh.links_up < world - 1)
      throw transport_error(transport_failure::aborted, -1, "connect: " + sh.abort_reason);
    if (complete) return;

    std::ostringstream out;
    out << "connect: rank " << me << " (epoch " << config.epoch << ") could not reach";
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      const link_shared& l = at(p).shared(lk);
      if (l.up) continue;
      if (first_missing < 0) first_missing = p;
      const peer_endpoint& e = peers[static_cast<std::size_t>(p)];
      out << " peer " << p << " at " << e.host << ":" << e.port << " ("
          << (l.last_connect_error.empty()
                  ? std::string(p < me ? "no answer" : "it never connected")
                  : l.last_connect_error)
          << ");";
    }
    out << " within " << config.connect_timeout.count() << " ms";
    why = out.str();
  }
  abort(why);
  throw transport_error(transport_failure::connect_failed, first_missing, why);
}

void host_transport::state::start_accept() {
  io_only.acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (io_only.closed || !io_only.acceptor.is_open()) return;
    if (!ec) {
      // Several connections may be handshaking at once; a silent one must not block the others.
      auto h = std::make_shared<handshake>(std::move(socket));
      std::erase_if(io_only.handshakes, [](const auto& w) { return w.expired(); });
      io_only.handshakes.push_back(h);
      put_u32(h->greeting.data(), handshake_magic);
      put_u32(h->greeting.data() + 4, handshake_version);
      std::memcpy(h->greeting.data() + 8, h->challenge.data(), challenge_size);
      asio::async_write(h->socket, asio::buffer(h->greeting), [this, h](boost::system::error_code write_ec, std::size_t) {
        if (io_only.closed || write_ec) return;
        asio::async_read(h->socket, asio::buffer(h->hello), [this, h](boost::system::error_code read_ec, std::size_t) {
          if (io_only.closed || read_ec) return;  // the stranger went away
          on_hello(h);
        });
      });
    }
    // Errors such as EMFILE are transient for an acceptor; keep serving the mesh.
    start_accept();
  });
}

handshake_status host_transport::state::check_hello(const std::shared_ptr<handshake>& h) {
  const std::byte* in = h->hello.data();
  const std::uint64_t their_epoch = get_u64(in + 8);
  const int their_rank = static_cast<int>(get_u32(in + 16));
  const int their_world = static_cast<int>(get_u32(in + 20));
  if (their_epoch != config.epoch) return handshake_status::wrong_epoch;
  if (their_world != world || their_rank <= config.rank || their_rank >= world) return handshake_status::bad_rank;
  challenge_bytes theirs;
  std::memcpy(theirs.data(), in + 24, challenge_size);
  const link_claim claim{config.epoch, their_rank, config.rank, world};
  // The proof comes before the rank is reserved: a connection that cannot prove the key
  // never holds a rank, so it cannot turn the real peer away as a duplicate.
  if (!proof_matches({in + 24 + challenge_size, proof_size},
                     link_proof(link_role::dialer, config.auth_key, config.auth_nonce, claim, h->challenge, theirs)))
    return handshake_status::unauthenticated;
  auto lk = lock();
  link_shared& l = at(their_rank).shared(lk);
  if (l.handshaking || l.up) return handshake_status::duplicate;
  l.handshaking = true;
  return handshake_status::ok;
}

void host_transport::state::on_hello(const std::shared_ptr<handshake>& h) {
  const std::byte* in = h->hello.data();
  const bool ours = get_u32(in) == handshake_magic && get_u32(in + 4) == handshake_version;
  if (!ours) return;  // not a transport peer: the handshake object closes it when released
  const int their_rank = static_cast<int>(get_u32(in + 16));
  const handshake_status status = check_hello(h);
  if (status == handshake_status::unauthenticated) {
    // What connect() reports if the rank never links: most likely a worker with another token.
    boost::system::error_code ec;
    const auto from = h->socket.remote_endpoint(ec);
    auto lk = lock();
    at(their_rank).shared(lk).last_connect_error =
        "a connection claiming it" + (ec ? std::string() : " from " + from.address().to_string()) +
        " could not prove the job's key";
  }
  put_u32(h->ack.data(), handshake_magic);
  put_u32(h->ack.data() + 4, static_cast<std::uint32_t>(status));
  put_u64(h->ack.data() + 8, config.epoch);
  std::fill(h->ack.begin() + 16, h->ack.end(), std::byte{0});
  if (status == handshake_status::ok) {
    challenge_bytes theirs;
    std::memcpy(theirs.data(), in + 24, challenge_size);
    const proof_bytes mine = link_proof(link_role::acceptor, config.auth_key, config.auth_nonce,
                                        {config.epoch, their_rank, config.rank, world}, h->challenge, theirs);
    std::memcpy(h->ack.data() + 16, mine.data(), proof_size);
  }
  asio::async_write(h->socket, asio::buffer(h->ack),
                    [this, h, status, their_rank](boost::system::error_code ec, std::size_t) {
                      if (io_only.closed || status != handshake_status::ok) return;
                      link& l = at(their_rank);
                      if (ec) {
                        auto lk = lock();
                        link_shared& ls = l.shared(lk);
                        ls.handshaking = false;  // let the peer's retry in
                        ls.last_connect_error = "handshake failed: " + ec.message();
                        return;
                      }
                      l.io.socket = std::make_unique<tcp::socket>(std::move(h->socket));
                      link_up(their_rank);
                    });
}

void host_transport::state::start_connect(int peer) {
  link_io& l = at(peer).io;
  l.socket = std::make_unique<tcp::socket>(io);
  const tcp::endpoint& to = io_only.endpoints[static_cast<std::size_t>(peer)];
  l.socket->async_connect(to, [this, peer](boost::system::error_code ec) {
    if (io_only.closed) return;
    if (ec) return retry_connect(peer, ec.message());
    link_io& l = at(peer).io;
    asio::async_read(*l.socket, asio::buffer(l.dial.greeting), [this, peer](auto read_ec, auto) {
      if (io_only.closed) return;
      // EOF here: a listener that is not (or no longer) ours closed on us.
      if (read_ec) return retry_connect(peer, "handshake: " + read_ec.message());
      on_greeting(peer);
    });
  });
}

void host_transport::state::on_greeting(int peer) {
  link_io& l = at(peer).io;
  const std::byte* in = l.dial.greeting.data();
  if (get_u32(in) != handshake_magic) return retry_connect(peer, "the listener is not an Oobleck transport");
  if (get_u32(in + 4) != handshake_version)
    return retry_connect(peer, "it speaks handshake version " + std::to_string(get_u32(in + 4)) + ", not " +
                                   std::to_string(handshake_version));
  std::memcpy(l.dial.acceptor_challenge.data(), in + 8, challenge_size);
  l.dial.dialer_challenge = fresh_challenge();
  std::byte* out = l.dial.hello.data();
  put_u32(out, handshake_magic);
  put_u32(out + 4, handshake_version);
  put_u64(out + 8, config.epoch);
  put_u32(out + 16, static_cast<std::uint32_t>(config.rank));
  put_u32(out + 20, static_cast<std::uint32_t>(world));
  std::memcpy(out + 24, l.dial.dialer_challenge.data(), challenge_size);
  const proof_bytes proof = link_proof(link_role::dialer, config.auth_key, config.auth_nonce,
                                       {config.epoch, config.rank, peer, world}, l.dial.acceptor_challenge,
                                       l.dial.dialer_challenge);
  std::memcpy(out + 24 + challenge_size, proof.data(), proof_size);
  asio::async_write(*l.socket, asio::buffer(l.dial.hello), [this, peer](auto write_ec, auto) {
    if (io_only.closed) return;
    if (write_ec) return retry_connect(peer, write_ec.message());
    link_io& l = at(peer).io;
    asio::async_read(*l.socket, asio::buffer(l.dial.ack), [this, peer](auto read_ec, auto) {
      if (io_only.closed) return;
      if (read_ec) return retry_connect(peer, "handshake: " + read_ec.message());
      on_ack(peer);
    });
  });
}

void host_transport::state::on_ack(int peer) {
  const connect_state& dial = at(peer).io.dial;
  const std::byte* in = dial.ack.data();
  const auto status = static_cast<handshake_status>(get_u32(in + 4));
  const std::uint64_t their_epoch = get_u64(in + 8);
  if (get_u32(in) != handshake_magic) return retry_connect(peer, "the listener is not an Oobleck transport");
  switch (status) {
    case handshake_status::ok: {
      // The listener must prove the key too: a stranger listening where the peer should be
      // would otherwise receive this rank's data.
      const proof_bytes expected = link_proof(link_role::acceptor, config.auth_key, config.auth_nonce,
                                              {config.epoch, config.rank, peer, world}, dial.acceptor_challenge,
                                              dial.dialer_challenge);
      if (!proof_matches({in + 16, proof_size}, expected))
        return retry_connect(peer, "the listener could not prove the job's key (not rank " + std::to_string(peer) +
                                       " of this epoch, or another token)");
      return link_up(peer);
    }
    case handshake_status::wrong_epoch:
      return retry_connect(peer, "it is at epoch " + std::to_string(their_epoch) + ", not " +
                                     std::to_string(config.epoch));
    case handshake_status::bad_rank:
      return retry_connect(peer, "it refused rank " + std::to_string(config.rank) + " of " + std::to_string(world));
    case handshake_status::duplicate:
      return retry_connect(peer, "it already has a connection from rank " + std::to_string(config.rank));
    case handshake_status::unauthenticated:
      return retry_connect(peer, "it refused this rank's proof of the job's key (another token, or another "
                                 "nonce for epoch " + std::to_string(config.epoch) + ")");
  }
  retry_connect(peer, "unknown handshake status");
}

void host_transport::state::retry_connect(int peer, std::string why) {
  link& l = at(peer);
  boost::system::error_code ignored;
  l.io.socket->close(ignored);
  {
    auto lk = lock();
    l.shared(lk).last_connect_error = std::move(why);
  }
  // The peer may simply not listen yet (it starts at its own pace); connect() owns the deadline,
  // and its abort cancels this timer. Back off so a missing peer costs little CPU.
  connect_state& dial = l.io.dial;
  if (!dial.retry_timer) dial.retry_timer = std::make_unique<asio::steady_timer>(io);
  dial.retry_timer->expires_after(dial.retry_delay);
  dial.retry_delay = std::min(dial.retry_delay * 2, std::chrono::milliseconds(200));
  dial.retry_timer->async_wait([this, peer](boost::system::error_code ec) {
    if (io_only.closed || ec) return;
    start_connect(peer);
  });
}

void host_transport::state::link_up(int peer) {
  link& l = at(peer);
  boost::system::error_code ignored;
  // Latency matters for small control-sized messages of a pipeline schedule.
  l.io.socket->set_option(tcp::no_delay(true), ignored);
  // The I/O thread reads and writes with its own non-blocking system calls
  // (transport_link_read.cpp, transport_link_write.cpp).
  l.io.socket->non_blocking(true, ignored);
  l.io.fd = l.io.socket->native_handle();
  // Socket buffers stay auto-tuned: fixing SO_SNDBUF/SO_RCVBUF (at most net.core.*mem_max, 4 MiB
  // here) measured slower than the kernel's tuning, which grows the receive buffer to 32 MiB.
  {
    auto lk = lock();
    link_shared& ls = l.shared(lk);
    ls.up = true;
    ls.user_fd = l.io.fd;
    transport_shared& sh = shared(lk);
    ++sh.links_up;
    if (sh.links_up == world - 1) {
      // Everyone is here: stop listening so the port is free and strangers get refused, and drop
      // the connections still handshaking (strangers that never proved anything).
      io_only.acceptor.close(ignored);
      for (auto& h : io_only.handshakes)
        if (auto alive = h.lock()) alive->socket.close(ignored);
      io_only.handshakes.clear();
    }
  }
  cv.notify_all();
  start_read(peer);
}

void host_transport::state::wait_connected(int peer) {
  const std::string op = "wait for the link to peer " + std::to_string(peer);
  check_peer(op, peer);
  auto lk = lock();
  const transport_shared& sh = shared(lk);
  const link_shared& l = at(peer).shared(lk);
  lk.wait(cv, [&] { return sh.is_aborted || l.up || l.broken; });
  const int one[1] = {peer};
  throw_if_failed(lk, op, one);
}

}  // namespace oobleck::runtime
