// A link's incoming stream: frames parsed from the socket, bodies read straight into a receive
// that already waits for them, or into a pooled buffer for the mailbox.
//
// The I/O thread drives the sockets with its own non-blocking readv/sendmsg calls and uses Asio
// only to wait for readiness. Asio's composed async_read/async_write move at most 64 KiB per
// system call, which made large messages cost thousands of calls and handler round trips;
// here a read fills the rest of the current body and the next headers at once.
//
// A waiting thread reads. A receive that waits awake (transport_config::spin_wait) reads its
// link itself while the I/O thread's read side is parked: the message is in the socket as soon
// as the sender's write returns, and the waiting thread, awake, takes it within microseconds,
// where the I/O thread would first have to be woken (tens of microseconds on a VM, more when
// both cores are busy) and then wake the receiver in turn. The read side has one owner at a
// time (link_shared::read_parked, caller_reading): the I/O thread parks it only after reading
// everything there was, so the next arrival is an edge its wait sees; a waiting thread that
// stops before the socket is empty, or whose read met an edge the I/O thread was woken for,
// hands the read side back with a posted read pass. A failure the waiting thread meets (the end
// of the stream, an error, a frame that breaks the protocol) is handled by the I/O thread, which
// alone fails links; a link that fails while a waiting thread reads keeps its socket open until
// that thread is done (as for a sending thread, transport_link_write.cpp).

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

ssize_t host_transport::state::read_once(int peer, int fd) {
  read_state& in = at(peer).io.in;
  std::array<iovec, 2> iov{};
  int count = 0;
  if (in.in_frame)  // consume_stage emptied the stage into this body
    iov[count++] = {in.target.data() + in.done, in.target.size() - in.done};
  iov[count++] = {in.stage.get() + in.stage_end, stage_capacity - in.stage_end};
  const ssize_t n = ::readv(fd, iov.data(), count);
  if (n <= 0) return n;  // errno untouched
  // Acknowledge at once. Traffic in both directions puts Linux in its "interactive" mode, which
  // delays acknowledgements to piggyback them on replies; a bulk sender then runs out of send
  // buffer (unacknowledged bytes) and stalls. Measured on loopback: 64 MiB p2p 21 -> 15 ms,
  // all-reduce 10-15% faster. The flag does not stick, hence once per read.
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
  std::size_t left = static_cast<std::size_t>(n);
  if (in.in_frame) {
    const std::size_t body = std::min(left, in.target.size() - in.done);
    in.done += body;
    left -= body;
    if (in.done == in.target.size()) finish_frame(peer);
  }
  in.stage_end += left;
  return n;
}

void host_transport::state::read_pass(int peer) {
  link_io& l = at(peer).io;
  read_state& in = l.in;
  {
    auto lk = lock();
    link_shared& ls = at(peer).shared(lk);
    if (ls.caller_reading) {
      ls.read_wanted = true;  // the waiting thread posts a pass when it is done
      return;
    }
    ls.read_parked = false;
  }
  std::size_t moved = 0;
  for (;;) {
    if (io_only.closed || l.fd < 0) return;
    if (!consume_stage(peer)) return;
    const ssize_t n = read_once(peer, l.fd);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // Nothing left: wait for the next bytes (the reactor is edge-triggered, and this pass
        // read everything there was, so the next arrival is an edge). A waiting thread may read
        // meanwhile; one wait is enough, whoever read last.
        {
          auto lk = lock();
          at(peer).shared(lk).read_parked = true;
        }
        if (!in.wait_armed) {
          in.wait_armed = true;
          l.socket->async_wait(tcp::socket::wait_read, [this, peer](boost::system::error_code ec) {
            at(peer).io.in.wait_armed = false;
            if (ec || io_only.closed) return;
            read_pass(peer);
          });
        }
        return;
      }
      return fail_link(peer, boost::system::error_code(errno, asio::error::get_system_category()));
    }
    if (n == 0) {
      // Whole messages read before the end are already delivered (consume_stage ran above).
      return fail_link(peer, asio::error::eof);
    }
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

bool host_transport::state::caller_read(int peer, const recv_request& req) {
  link& lnk = at(peer);
  int fd = -1;
  {
    auto lk = lock();
    link_shared& ls = lnk.shared(lk);
    if (!ls.read_parked || ls.caller_reading || ls.broken || ls.user_fd < 0 || shared(lk).is_aborted) return false;
    ls.caller_reading = true;
    ls.read_parked = false;
    fd = ls.user_fd;  // stays open while caller_reading (break_link defers the close)
  }
  enum class ending { drained, more, failed } how = ending::more;
  int error = 0;          // failed: the read's errno, 0 for the end of the stream
  std::string violation;  // failed: the frame that broke the protocol
  bool read_any = false;
  std::size_t moved = 0;
  for (;;) {
    if (!consume_stage(peer, &violation)) {
      how = ending::failed;
      break;
    }
    const ssize_t n = read_once(peer, fd);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      how = ending::drained;
      break;
    }
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      how = ending::failed;
      break;
    }
    read_any = true;
    waiting_reads.fetch_add(1, std::memory_order_relaxed);
    moved += static_cast<std::size_t>(n);
    bool mine = false;
    {
      auto lk = lock();
      mine = req.stage == recv_stage::done;
    }
    if (mine || moved >= yield_after_bytes) {
      // Its own message is here (or it has read a lot for others): what is left is the I/O
      // thread's, which reads until the socket is empty.
      if (!consume_stage(peer, &violation)) how = ending::failed;
      break;
    }
  }
  bool post_read = false;
  {
    auto lk = lock();
    link_shared& ls = lnk.shared(lk);
    if (how == ending::failed || ls.broken) {
      // The I/O thread ends it: the link fails with this read's cause, or, failed meanwhile, has
      // its read state dropped and its socket closed. The read side stays taken until then, so no
      // read pass of the I/O thread's own meets the failure first (and names it otherwise).
      asio::post(io, [this, peer, error, violation] { take_failed_read(peer, error, violation); });
      return read_any;
    }
    ls.caller_reading = false;
    if (how == ending::drained && !ls.read_wanted) {
      ls.read_parked = true;  // the I/O thread's wait is still armed
    } else {
      ls.read_wanted = false;
      post_read = true;
    }
  }
  if (post_read) asio::post(io, [this, peer] { read_pass(peer); });
  return read_any;
}

void host_transport::state::take_failed_read(int peer, int error, const std::string& violation) {
  bool broken = false, close_now = false;
  {
    auto lk = lock();
    link_shared& ls = at(peer).shared(lk);
    ls.caller_reading = false;
    ls.read_wanted = false;
    broken = ls.broken;  // it broke while the read side was taken: break_link left both to here
    close_now = broken && !ls.caller_writing && std::exchange(ls.close_deferred, false);
  }
  if (broken) {
    // That failure (an abort, the write side, or this read's own met first) stands.
    drop_read_state(at(peer));
    if (close_now) close_deferred_socket(peer);
    return;
  }
  if (!violation.empty()) {
    protocol_violation(peer, violation);
    return;
  }
  fail_link(peer, error ? boost::system::error_code(error, asio::error::get_system_category())
                        : boost::system::error_code(asio::error::eof));
}

bool host_transport::state::consume_stage(int peer, std::string* violation) {
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
      std::string why;
      if (size > config.max_frame_bytes)
        why = "it sent a frame of " + std::to_string(size) + " bytes, more than the largest this epoch carries (" +
              std::to_string(config.max_frame_bytes) + " bytes)";
      else if ((key >> 32) >= channel_count)
        why = "it sent a frame of unknown kind " + std::to_string(key >> 32);
      if (!why.empty()) {
        if (!violation) return protocol_violation(peer, why);
        *violation = std::move(why);  // a waiting thread's read: the I/O thread fails the link
        return false;
      }
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
