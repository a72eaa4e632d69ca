// A link's incoming stream on the I/O thread: frames parsed from the socket, bodies read
// straight into a receive that already waits for them, or into a pooled buffer for the mailbox.
//
// The I/O thread drives the sockets with its own non-blocking readv/sendmsg calls and uses Asio
// only to wait for readiness. Asio's composed async_read/async_write move at most 64 KiB per
// system call, which made large messages cost thousands of calls and handler round trips;
// here a read fills the rest of the current body and the next headers at once.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

namespace {

// Bytes read past the current body (the next headers and small bodies) land here.
constexpr std::size_t stage_capacity = std::size_t{64} << 10;

}  // namespace

void host_transport::state::start_read(int peer) {
  at(peer).io.in.stage = std::make_unique<std::byte[]>(stage_capacity);
  read_pass(peer);
}

void host_transport::state::read_pass(int peer) {
  link_io& l = at(peer).io;
  read_state& in = l.in;
  std::size_t moved = 0;
  for (;;) {
    if (io_only.closed || l.fd < 0) return;
    if (!consume_stage(peer)) return;
    std::array<iovec, 2> iov{};
    int count = 0;
    if (in.in_frame)  // consume_stage emptied the stage into this body
      iov[count++] = {in.target.data() + in.done, in.target.size() - in.done};
    iov[count++] = {in.stage.get() + in.stage_end, stage_capacity - in.stage_end};
    const ssize_t n = ::readv(l.fd, iov.data(), count);
    if (n > 0) {
      // Acknowledge at once. Traffic in both directions puts Linux in its "interactive" mode,
      // which delays acknowledgements to piggyback them on replies; a bulk sender then runs out
      // of send buffer (unacknowledged bytes) and stalls. Measured on loopback: 64 MiB p2p
      // 21 -> 15 ms, all-reduce 10-15% faster. The flag does not stick, hence once per read.
      const int one = 1;
      ::setsockopt(l.fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // Nothing left: wait for the next bytes (the reactor is edge-triggered, and this pass
        // read everything there was, so the next arrival is an edge).
        l.socket->async_wait(tcp::socket::wait_read, [this, peer](boost::system::error_code ec) {
          if (ec || io_only.closed) return;
          read_pass(peer);
        });
        return;
      }
      return fail_link(peer, boost::system::error_code(errno, asio::error::get_system_category()));
    }
    if (n == 0) {
      // Whole messages read before the end are already delivered (consume_stage ran above).
      return fail_link(peer, asio::error::eof);
    }
    std::size_t left = static_cast<std::size_t>(n);
    if (in.in_frame) {
      const std::size_t body = std::min(left, in.target.size() - in.done);
      in.done += body;
      left -= body;
      if (in.done == in.target.size()) finish_frame(peer);
    }
    in.stage_end += left;
    moved += static_cast<std::size_t>(n);
    if (moved >= yield_after_bytes) {
      // Let the other links and the writes run; the socket still has bytes, so come back by
      // posting rather than by waiting for an edge that may not come.
      if (!consume_stage(peer)) return;
      asio::post(io, [this, peer] { read_pass(peer); });
      return;
    }
  }
}

bool host_transport::state::consume_stage(int peer) {
  read_state& in = at(peer).io.in;
  for (;;) {
    const std::size_t avail = in.stage_end - in.stage_begin;
    if (!in.in_frame) {
      if (avail < frame_header_size) break;
      const std::byte* h = in.stage.get() + in.stage_begin;
      const std::uint64_t key = get_u64(h);
      const std::uint64_t size = get_u64(h + 8);
      in.stage_begin += frame_header_size;
      // Checked before anything is allocated for the body.
      if (size > config.max_frame_bytes)
        return protocol_violation(peer, "it sent a frame of " + std::to_string(size) +
                                            " bytes, more than the largest this epoch carries (" +
                                            std::to_string(config.max_frame_bytes) + " bytes)");
      if ((key >> 32) >= channel_count)
        return protocol_violation(peer, "it sent a frame of unknown kind " + std::to_string(key >> 32));
      begin_frame(peer, key, size);
      continue;
    }
    if (avail == 0) break;
    const std::size_t n = std::min(avail, in.target.size() - in.done);
    std::memcpy(in.target.data() + in.done, in.stage.get() + in.stage_begin, n);
    in.stage_begin += n;
    in.done += n;
    if (in.done == in.target.size()) finish_frame(peer);
  }
  // What is left is part of a header: move it to the front.
  const std::size_t rest = in.stage_end - in.stage_begin;
  if (rest && in.stage_begin) std::memmove(in.stage.get(), in.stage.get() + in.stage_begin, rest);
  in.stage_begin = 0;
  in.stage_end = rest;
  return true;
}

bool host_transport::state::protocol_violation(int peer, const std::string& why) {
  const std::string reason = "peer " + std::to_string(peer) + " broke the data-plane protocol: " + why +
                             "; the epoch's data plane is closed";
  {
    // Aborted before the receive waiting on this link is woken: whoever sees that failure sees
    // the data plane aborted too (abort() below keeps this reason and closes every link).
    auto lk = lock();
    transport_shared& sh = shared(lk);
    if (!sh.is_aborted) {
      sh.is_aborted = true;
      sh.abort_reason = reason;
    }
  }
  fail_link(peer, {}, reason);
  abort(reason);  // on the I/O thread: closes every link now
  return false;
}

void host_transport::state::begin_frame(int peer, std::uint64_t key, std::uint64_t size) {
  read_state& in = at(peer).io.in;
  in.in_frame = true;
  in.key = key;
  in.done = 0;
  {
    // A receive already waiting for exactly this message gets the bytes straight from the
    // socket: no intermediate buffer and no copy.
    auto lk = lock();
    in.direct = shared(lk).boxes.claim_direct({peer, key}, static_cast<std::size_t>(size));
    if (in.direct) in.target = in.direct->out;
  }
  if (!in.direct) {
    in.body = pool->allocate(static_cast<std::size_t>(size));
    in.target = in.body.bytes();
  }
  if (size == 0) finish_frame(peer);
}

void host_transport::state::finish_frame(int peer) {
  read_state& in = at(peer).io.in;
  in.in_frame = false;
  in.target = {};
  if (recv_request* direct = std::exchange(in.direct, nullptr)) {
    {
      auto lk = lock();
      direct->stage = recv_stage::done;
    }
    cv.notify_all();
    return;
  }
  deliver(peer, in.key, std::move(in.body));
}

}  // namespace oobleck::runtime
