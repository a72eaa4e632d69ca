// Mesh set-up on the I/O thread: each rank accepts the higher ranks and connects to the lower
// ones, and a handshake checks the epoch so a straggler of another epoch can never join.

#include <algorithm>
#include <string>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

void host_transport::state::start_accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (io_closed || !acceptor.is_open()) return;
    if (!ec) {
      // Several connections may be handshaking at once; a silent one must not block the others.
      auto h = std::make_shared<handshake>(std::move(socket));
      std::erase_if(handshakes, [](const auto& w) { return w.expired(); });
      handshakes.push_back(h);
      asio::async_read(h->socket, asio::buffer(h->hello),
                       [this, h](boost::system::error_code read_ec, std::size_t) {
                         if (io_closed || read_ec) return;  // the stranger went away
                         on_hello(h);
                       });
    }
    // Errors such as EMFILE are transient for an acceptor; keep serving the mesh.
    start_accept();
  });
}

void host_transport::state::on_hello(const std::shared_ptr<handshake>& h) {
  const std::byte* in = h->hello.data();
  const bool ours = get_u32(in) == handshake_magic && get_u32(in + 4) == handshake_version;
  if (!ours) return;  // not a transport peer: the handshake object closes it when released
  const std::uint64_t their_epoch = get_u64(in + 8);
  const int their_rank = static_cast<int>(get_u32(in + 16));
  const int their_world = static_cast<int>(get_u32(in + 20));

  handshake_status status = handshake_status::ok;
  if (their_epoch != config.epoch) {
    status = handshake_status::wrong_epoch;
  } else if (their_world != world || their_rank <= config.rank || their_rank >= world) {
    status = handshake_status::bad_rank;
  } else {
    std::lock_guard lock(mu);
    link& l = links[static_cast<std::size_t>(their_rank)];
    if (l.handshaking || l.up)
      status = handshake_status::duplicate;
    else
      l.handshaking = true;
  }
  put_u32(h->ack.data(), handshake_magic);
  put_u32(h->ack.data() + 4, static_cast<std::uint32_t>(status));
  put_u64(h->ack.data() + 8, config.epoch);
  asio::async_write(h->socket, asio::buffer(h->ack),
                    [this, h, status, their_rank](boost::system::error_code ec, std::size_t) {
                      if (io_closed || status != handshake_status::ok) return;
                      link& l = links[static_cast<std::size_t>(their_rank)];
                      if (ec) {
                        std::lock_guard lock(mu);
                        l.handshaking = false;  // let the peer's retry in
                        l.last_connect_error = "handshake failed: " + ec.message();
                        return;
                      }
                      l.socket = std::make_unique<tcp::socket>(std::move(h->socket));
                      link_up(their_rank);
                    });
}

void host_transport::state::start_connect(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  l.socket = std::make_unique<tcp::socket>(io);
  l.socket->async_connect(
      endpoints[static_cast<std::size_t>(peer)], [this, peer](boost::system::error_code ec) {
        if (io_closed) return;
        if (ec) return retry_connect(peer, ec.message());
        link& l = links[static_cast<std::size_t>(peer)];
        std::byte* out = l.hello.data();
        put_u32(out, handshake_magic);
        put_u32(out + 4, handshake_version);
        put_u64(out + 8, config.epoch);
        put_u32(out + 16, static_cast<std::uint32_t>(config.rank));
        put_u32(out + 20, static_cast<std::uint32_t>(world));
        asio::async_write(*l.socket, asio::buffer(l.hello), [this, peer](auto write_ec, auto) {
          if (io_closed) return;
          if (write_ec) return retry_connect(peer, write_ec.message());
          link& l = links[static_cast<std::size_t>(peer)];
          asio::async_read(*l.socket, asio::buffer(l.ack), [this, peer](auto read_ec, auto) {
            if (io_closed) return;
            // EOF here: a listener that is not (or no longer) ours closed on us.
            if (read_ec) return retry_connect(peer, "handshake: " + read_ec.message());
            const std::byte* in = links[static_cast<std::size_t>(peer)].ack.data();
            const auto status = static_cast<handshake_status>(get_u32(in + 4));
            const std::uint64_t their_epoch = get_u64(in + 8);
            if (get_u32(in) != handshake_magic)
              return retry_connect(peer, "the listener is not an Oobleck transport");
            switch (status) {
              case handshake_status::ok:
                return link_up(peer);
              case handshake_status::wrong_epoch:
                return retry_connect(peer, "it is at epoch " + std::to_string(their_epoch) +
                                               ", not " + std::to_string(config.epoch));
              case handshake_status::bad_rank:
                return retry_connect(peer, "it refused rank " + std::to_string(config.rank) +
                                               " of " + std::to_string(world));
              case handshake_status::duplicate:
                return retry_connect(
                    peer, "it already has a connection from rank " + std::to_string(config.rank));
            }
            retry_connect(peer, "unknown handshake status");
          });
        });
      });
}

void host_transport::state::retry_connect(int peer, std::string why) {
  link& l = links[static_cast<std::size_t>(peer)];
  boost::system::error_code ignored;
  l.socket->close(ignored);
  {
    std::lock_guard lock(mu);
    l.last_connect_error = std::move(why);
  }
  // The peer may simply not listen yet (it starts at its own pace); connect() owns the deadline,
  // and its abort cancels this timer. Back off so a missing peer costs little CPU.
  if (!l.retry_timer) l.retry_timer = std::make_unique<asio::steady_timer>(io);
  l.retry_timer->expires_after(l.retry_delay);
  l.retry_delay = std::min(l.retry_delay * 2, std::chrono::milliseconds(200));
  l.retry_timer->async_wait([this, peer](boost::system::error_code ec) {
    if (io_closed || ec) return;
    start_connect(peer);
  });
}

void host_transport::state::link_up(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  boost::system::error_code ignored;
  // Latency matters for small control-sized messages of a pipeline schedule.
  l.socket->set_option(tcp::no_delay(true), ignored);
  // The I/O thread reads and writes with its own non-blocking system calls (transport_io.cpp).
  l.socket->non_blocking(true, ignored);
  l.fd = l.socket->native_handle();
  // Socket buffers stay auto-tuned: fixing SO_SNDBUF/SO_RCVBUF (at most net.core.*mem_max, 4 MiB
  // here) measured slower than the kernel's tuning, which grows the receive buffer to 32 MiB.
  {
    std::lock_guard lock(mu);
    l.up = true;
    l.user_fd = l.fd;
    ++links_up;
    if (links_up == world - 1) {
      // Everyone is here: stop listening so the port is free and strangers get refused.
      acceptor.close(ignored);
    }
  }
  cv.notify_all();
  start_read(peer);
}

}  // namespace oobleck::runtime
