// The data path: per-link read loop and write queue on the I/O thread, mailboxes matching
// messages to receives, and the point-to-point send()/recv().
//
// The I/O thread drives the sockets with its own non-blocking readv/sendmsg calls and uses Asio
// only to wait for readiness. Asio's composed async_read/async_write move at most 64 KiB per
// system call, which made large messages cost thousands of calls and handler round trips;
// here a call moves as much as the kernel takes (a whole socket buffer), several frames go out
// in one sendmsg, and a read fills the rest of the current body and the next headers at once.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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
// A read or write pass yields to the other links' handlers after moving this much.
constexpr std::size_t yield_after_bytes = std::size_t{8} << 20;
// Pieces gathered into one sendmsg.
constexpr std::size_t max_iov = 64;
// A zero-copy send or a collective's segment written from the sending thread (link idle) moves
// at most this much there, a few tens of microseconds of copying into the kernel; the I/O
// thread writes the rest, so the sender goes back to computing.
constexpr std::size_t direct_budget = std::size_t{256} << 10;
// A copying send that finds the socket full copies a rest this small at once.
constexpr std::size_t small_rest = std::size_t{256} << 10;

boost::system::error_code errno_code(int e) {
  return {e, boost::asio::error::get_system_category()};
}

std::string describe(int peer, boost::system::error_code ec) {
  const std::string who = "peer " + std::to_string(peer);
  if (ec == asio::error::eof) return who + " closed the connection";
  if (ec == asio::error::connection_reset) return who + " reset the connection";
  if (ec == asio::error::broken_pipe) return who + " closed the connection (broken pipe)";
  return "I/O error on the connection to " + who + ": " + ec.message();
}

std::string with_tag(const std::string& what, int peer, std::uint32_t tag) {
  return what + " peer " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

}  // namespace

// --- reading ------------------------------------------------------------------------------

void host_transport::state::start_read(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  l.stage = std::make_unique<std::byte[]>(stage_capacity);
  read_pass(peer);
}

void host_transport::state::read_pass(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  std::size_t moved = 0;
  for (;;) {
    if (io_closed || l.fd < 0) return;
    if (!consume_stage(peer)) return;
    std::array<iovec, 2> iov{};
    int count = 0;
    if (l.in_frame)  // consume_stage emptied the stage into this body
      iov[count++] = {l.in_target.data() + l.in_done, l.in_target.size() - l.in_done};
    iov[count++] = {l.stage.get() + l.stage_end, stage_capacity - l.stage_end};
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
          if (ec || io_closed) return;
          read_pass(peer);
        });
        return;
      }
      return fail_link(peer, errno_code(errno));
    }
    if (n == 0) {
      // Whole messages read before the end are already delivered (consume_stage ran above).
      return fail_link(peer, asio::error::eof);
    }
    std::size_t left = static_cast<std::size_t>(n);
    if (l.in_frame) {
      const std::size_t body = std::min(left, l.in_target.size() - l.in_done);
      l.in_done += body;
      left -= body;
      if (l.in_done == l.in_target.size()) finish_frame(peer);
    }
    l.stage_end += left;
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
  link& l = links[static_cast<std::size_t>(peer)];
  for (;;) {
    const std::size_t avail = l.stage_end - l.stage_begin;
    if (!l.in_frame) {
      if (avail < frame_header_size) break;
      const std::byte* h = l.stage.get() + l.stage_begin;
      const std::uint64_t key = get_u64(h);
      const std::uint64_t size = get_u64(h + 8);
      l.stage_begin += frame_header_size;
      if (size > max_frame_bytes) {
        fail_link(peer, {},
                  "protocol error: peer " + std::to_string(peer) + " sent a frame of " +
                      std::to_string(size) + " bytes");
        return false;
      }
      begin_frame(peer, key, size);
      continue;
    }
    if (avail == 0) break;
    const std::size_t n = std::min(avail, l.in_target.size() - l.in_done);
    std::memcpy(l.in_target.data() + l.in_done, l.stage.get() + l.stage_begin, n);
    l.stage_begin += n;
    l.in_done += n;
    if (l.in_done == l.in_target.size()) finish_frame(peer);
  }
  // What is left is part of a header: move it to the front.
  const std::size_t rest = l.stage_end - l.stage_begin;
  if (rest && l.stage_begin) std::memmove(l.stage.get(), l.stage.get() + l.stage_begin, rest);
  l.stage_begin = 0;
  l.stage_end = rest;
  return true;
}

void host_transport::state::begin_frame(int peer, std::uint64_t key, std::uint64_t size) {
  link& l = links[static_cast<std::size_t>(peer)];
  l.in_frame = true;
  l.in_key = key;
  l.in_done = 0;
  {
    // A receive already waiting for exactly this message gets the bytes straight from the
    // socket: no intermediate buffer and no copy.
    std::lock_guard lock(mu);
    auto it = mailboxes.find({peer, key});
    if (it != mailboxes.end() && it->second.arrived.empty() && !it->second.waiting.empty()) {
      recv_request* r = it->second.waiting.front();
      if (r->direct && r->out.size() == size) {
        it->second.waiting.pop_front();
        r->claimed = true;
        l.in_direct = r;
        l.in_target = r->out;
      }
    }
  }
  if (!l.in_direct) {
    l.in_body = pool->allocate(static_cast<std::size_t>(size));
    l.in_target = l.in_body.bytes();
  }
  if (size == 0) finish_frame(peer);
}

void host_transport::state::finish_frame(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  l.in_frame = false;
  l.in_target = {};
  if (recv_request* direct = std::exchange(l.in_direct, nullptr)) {
    {
      std::lock_guard lock(mu);
      direct->done = true;
    }
    cv.notify_all();
    return;
  }
  deliver(peer, l.in_key, std::move(l.in_body));
}

void host_transport::state::deliver(int peer, std::uint64_t key, payload body) {
  std::unique_lock lock(mu);
  mailbox& mb = mailboxes[{peer, key}];
  if (mb.waiting.empty()) {
    mb.arrived.push_back(std::move(body));
    return;
  }
  recv_request* r = mb.waiting.front();
  mb.waiting.pop_front();
  r->claimed = true;
  if (r->take) {
    r->taken = std::move(body);
  } else if (r->out.size() != body.size) {
    r->error = transport_failure::mismatch;
    r->error_reason = "received " + std::to_string(body.size) + " bytes, expected " +
                      std::to_string(r->out.size());
  } else {
    // Claimed: nobody else touches r, so the copy can run without the lock.
    lock.unlock();
    if (body.size) std::memcpy(r->out.data(), body.data.get(), body.size);
    lock.lock();
  }
  r->done = true;
  lock.unlock();
  cv.notify_all();
}

// --- failures -----------------------------------------------------------------------------

void host_transport::state::fail_link(int peer, boost::system::error_code ec,
                                      const std::string& detail) {
  link& l = links[static_cast<std::size_t>(peer)];
  std::deque<outgoing> dropped;  // released below, after the lock
  bool defer_close = false;
  {
    std::lock_guard lock(mu);
    if (!l.broken) {
      l.broken = true;
      if (is_aborted) {
        l.failure = transport_failure::aborted;
        l.failure_reason = abort_reason;
      } else {
        l.failure = transport_failure::peer_lost;
        l.failure_reason = detail.empty() ? describe(peer, ec) : detail;
      }
    }
    dropped.swap(l.outbox);
    l.user_fd = -1;
    // A thread writing to the descriptor keeps it open until it is done (no reuse under it).
    defer_close = l.caller_writing;
    if (defer_close) l.close_deferred = true;
  }
  cv.notify_all();
  boost::system::error_code ignored;
  if (l.socket) {
    if (defer_close) {
      l.socket->shutdown(tcp::socket::shutdown_both, ignored);  // the writer fails at once
      l.socket->cancel(ignored);
    } else {
      l.socket->close(ignored);  // pending waits complete with an error and stop
    }
  }
  l.fd = -1;
  drop_link_io(l);
}

void host_transport::state::close_deferred_socket(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  boost::system::error_code ignored;
  if (l.socket) l.socket->close(ignored);
}

void host_transport::state::drop_link_io(link& l) {
  // The send queue's bytes are no longer referenced by any system call: release them (oldest
  // first, so keep-alives are released in send order).
  l.send_queue.clear();
  l.in_frame = false;
  l.in_target = {};
  l.in_body = {};
  l.stage_begin = l.stage_end = 0;
  if (recv_request* direct = std::exchange(l.in_direct, nullptr)) {
    {
      std::lock_guard lock(mu);
      direct->error = l.failure;
      direct->error_reason = l.failure_reason;
      direct->done = true;
    }
    cv.notify_all();
  }
}

// --- writing ------------------------------------------------------------------------------

namespace {

/// The iovecs for what is left of `o`.
int unwritten(const outgoing& o, iovec* iov) {
  int count = 0;
  std::size_t skip = o.written;
  if (o.has_header) {
    if (skip < frame_header_size)
      iov[count++] = {const_cast<std::byte*>(o.header.data()) + skip, frame_header_size - skip};
    skip = skip > frame_header_size ? skip - frame_header_size : 0;
  }
  if (o.size > skip) iov[count++] = {const_cast<std::byte*>(o.data) + skip, o.size - skip};
  return count;
}

/// Writes what is left of `o` (at most `budget` more bytes) to `fd` from the calling thread.
/// Stops when that is written, on an error (the I/O thread meets it again on the rest), and
/// when the socket is full: at once unless `patient` and more than `small_rest` is left, else
/// at `deadline`.
void write_direct(int fd, outgoing& o, bool patient, std::chrono::steady_clock::time_point deadline,
                  std::size_t budget) {
  const std::size_t stop = std::min(o.total(), o.written + budget);
  while (o.written < stop) {
    std::array<iovec, 2> iov{};
    msghdr msg{};
    msg.msg_iov = iov.data();
    int count = unwritten(o, iov.data());
    // Within the budget: trim the last iovec.
    std::size_t room = stop - o.written;
    for (int i = 0; i < count; ++i) {
      iov[i].iov_len = std::min(iov[i].iov_len, room);
      room -= iov[i].iov_len;
      if (iov[i].iov_len == 0) count = i;
    }
    msg.msg_iovlen = static_cast<std::size_t>(count);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      o.written += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // Full. A small rest is copied at once (cheaper than a wait for acknowledgements); a large
    // one is worth waiting for until the deadline: its copy may land in fresh pool memory,
    // whose first touch ran at 0.5 GB/s here (a 58 MB rest took 115 ms), far worse than a
    // receiver that pauses for a few milliseconds.
    const auto now = std::chrono::steady_clock::now();
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && patient &&
        o.total() - o.written > small_rest && now < deadline) {
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      const timespec timeout{static_cast<time_t>(left.count() / 1'000'000'000),
                             static_cast<long>(left.count() % 1'000'000'000)};
      const int r = ::ppoll(&p, 1, &timeout, nullptr);
      if (r > 0 || (r < 0 && errno == EINTR)) continue;  // writable, or an error to meet
    }
    return;
  }
}

}  // namespace

void host_transport::state::drain(int peer) {
  {
    std::lock_guard lock(mu);
    links[static_cast<std::size_t>(peer)].drain_posted = false;
  }
  flush(peer);
}

void host_transport::state::flush(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  if (l.write_waiting) return;  // the wait's handler flushes
  std::size_t moved = 0;
  for (;;) {
    if (io_closed || l.fd < 0) return;
    {
      // Pick up what user threads queued meanwhile, so one sendmsg carries as much as it can;
      // the moved-from pieces own nothing, so clearing them under the lock releases nothing.
      std::lock_guard lock(mu);
      if (l.caller_writing) {
        // A sending thread has the socket (it started while this queue was empty); it posts a
        // drain for what was queued behind it when it is done.
        l.io_busy = false;
        return;
      }
      for (auto& p : l.outbox) l.send_queue.push_back(std::move(p));
      l.outbox.clear();
      l.io_busy = !l.send_queue.empty();
    }
    if (l.send_queue.empty()) return;
    std::array<iovec, max_iov> iov{};
    std::size_t count = 0;
    for (auto it = l.send_queue.begin(); it != l.send_queue.end() && count + 2 <= max_iov; ++it)
      count += static_cast<std::size_t>(unwritten(*it, iov.data() + count));
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = count;
    const ssize_t n = ::sendmsg(l.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.write_waiting = true;
        l.socket->async_wait(tcp::socket::wait_write, [this, peer](boost::system::error_code ec) {
          links[static_cast<std::size_t>(peer)].write_waiting = false;
          if (ec || io_closed) return;
          flush(peer);
        });
        return;
      }
      return fail_link(peer, errno_code(errno));
    }
    // Release what was written completely (the caller's keep-alive goes here).
    std::size_t left = static_cast<std::size_t>(n);
    while (!l.send_queue.empty()) {
      outgoing& front = l.send_queue.front();
      const std::size_t rest = front.total() - front.written;
      if (left < rest) {
        front.written += left;
        break;
      }
      left -= rest;
      l.send_queue.pop_front();
    }
    moved += static_cast<std::size_t>(n);
    if (moved >= yield_after_bytes) {
      if (!l.write_posted) {
        l.write_posted = true;
        asio::post(io, [this, peer] {
          links[static_cast<std::size_t>(peer)].write_posted = false;
          flush(peer);
        });
      }
      return;
    }
  }
}

void host_transport::state::send_frame(const std::string& op, int peer, outgoing o,
                                       bool copying) {
  link& l = links[static_cast<std::size_t>(peer)];
  const int one[1] = {peer};
  int fd = -1;
  bool post = false;
  {
    std::unique_lock lock(mu);
    throw_if_failed(lock, op, one);  // `o` (and its keep-alive) is released after the lock
    if (l.user_fd >= 0 && !l.caller_writing && !l.io_busy && l.outbox.empty()) {
      // The link is idle: write from this thread, no hand-off and (for copying) no copy.
      l.caller_writing = true;
      fd = l.user_fd;
    } else if (!copying) {
      l.outbox.push_back(std::move(o));
      post = !std::exchange(l.drain_posted, true);
    }
  }
  if (fd < 0 && !copying) {
    // The outbox, not the post, fixes the order, so concurrent senders cannot reorder a stream.
    if (post) asio::post(io, [this, peer] { drain(peer); });
    return;
  }
  if (fd >= 0) {
    // A copying send may wait for the receiver while it keeps up: on a busy host the copy it
    // saves costs more than the wait (64 MiB p2p on 2 cores: 21 -> 15 ms). But not for long: it
    // copies what is left after 1 ms + 1 ms per MB (a 1 GB/s link's pace), so a slow or frozen
    // receiver holds it up about as long as a copy into fresh memory would.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1) +
                          std::chrono::microseconds(o.size / 1000);
    write_direct(fd, o, copying, deadline, copying ? o.total() : direct_budget);
  }
  bool dead = false;
  if (fd >= 0 && o.written < o.total()) {
    std::lock_guard lock(mu);
    dead = l.broken;  // aborted meanwhile: nothing to copy
  }
  if (copying && o.written < o.total() && !dead) {
    // Copy what is left, so the caller may reuse its buffer. While this thread still has the
    // socket (fd >= 0), nothing else can be written before this rest.
    const std::size_t body_done =
        o.written > frame_header_size ? o.written - frame_header_size : std::size_t{0};
    const payload rest = pool->copy_of({o.data + body_done, o.size - body_done});
    if (o.written > frame_header_size) {
      o.has_header = false;
      o.written = 0;
    }
    o.data = rest.data.get();
    o.size = rest.size;
    o.keep = rest.data;
  }
  bool close_now = false;
  {
    std::unique_lock lock(mu);
    if (fd >= 0) {
      l.caller_writing = false;
      close_now = std::exchange(l.close_deferred, false);
      // The rest goes before whatever others queued while this thread wrote; on a failed link
      // it is dropped (the failure surfaces on later operations).
      if (o.written < o.total() && !l.broken) l.outbox.push_front(std::move(o));
    } else {
      throw_if_failed(lock, op, one);
      l.outbox.push_back(std::move(o));
    }
    post = !l.outbox.empty() && !std::exchange(l.drain_posted, true);
  }
  if (post) asio::post(io, [this, peer] { drain(peer); });
  if (close_now) asio::post(io, [this, peer] { close_deferred_socket(peer); });
}

void host_transport::state::post_frame(const std::string& op, int peer, std::uint64_t key,
                                       std::span<const std::byte> body,
                                       std::shared_ptr<const void> keep) {
  outgoing o;
  o.has_header = true;
  put_u64(o.header.data(), key);
  put_u64(o.header.data() + 8, body.size());
  o.data = body.data();
  o.size = body.size();
  o.keep = std::move(keep);
  send_frame(op, peer, std::move(o), false);
}

void host_transport::state::post_payload(const std::string& op, int peer, std::uint64_t key,
                                         const payload& body) {
  post_frame(op, peer, key, body.bytes(), body.data);
}

void host_transport::state::post_copy(const std::string& op, int peer, std::uint64_t key,
                                      std::span<const std::byte> bytes) {
  outgoing o;
  o.has_header = true;
  put_u64(o.header.data(), key);
  put_u64(o.header.data() + 8, bytes.size());
  o.data = bytes.data();
  o.size = bytes.size();
  send_frame(op, peer, std::move(o), true);
}

// --- receiving ----------------------------------------------------------------------------

bool host_transport::state::post_recv(const std::string& op, int peer, std::uint64_t key,
                                      recv_request& req, std::span<const int> watch) {
  const std::pair<int, std::uint64_t> k{peer, key};
  const int one[1] = {peer};
  std::unique_lock lock(mu);
  if (is_aborted) throw transport_error(transport_failure::aborted, -1, op + ": " + abort_reason);
  // A message that arrived whole is delivered even if its sender has died since.
  auto it = mailboxes.find(k);
  if (it != mailboxes.end() && it->second.waiting.empty() && !it->second.arrived.empty()) {
    payload p = std::move(it->second.arrived.front());
    it->second.arrived.pop_front();
    if (it->second.arrived.empty()) mailboxes.erase(it);
    lock.unlock();
    if (req.take) {
      req.taken = std::move(p);
    } else if (p.size != req.out.size()) {
      throw transport_error(transport_failure::mismatch, peer,
                            op + ": received " + std::to_string(p.size) + " bytes, expected " +
                                std::to_string(req.out.size()));
    } else if (p.size) {
      std::memcpy(req.out.data(), p.data.get(), p.size);
    }
    req.done = true;  // never queued: nobody else knows `req`
    return true;
  }
  throw_if_failed(lock, op, one);
  throw_if_failed(lock, op, watch);
  mailboxes[k].waiting.push_back(&req);
  return false;
}

void host_transport::state::wait_posted(const std::string& op, int peer, std::uint64_t key,
                                        recv_request& req, std::span<const int> watch) {
  const std::pair<int, std::uint64_t> k{peer, key};
  const int one[1] = {peer};
  std::unique_lock lock(mu);
  auto failed = [&] {
    if (is_aborted || links[static_cast<std::size_t>(peer)].broken) return true;
    return std::any_of(watch.begin(), watch.end(), [&](int w) {
      return w != config.rank && links[static_cast<std::size_t>(w)].broken;
    });
  };
  // A claimed receive is completed by the I/O thread alone (it may be reading into req.out);
  // that takes at most the rest of one message, or until abort() closes its socket.
  cv.wait(lock, [&] { return req.done || (!req.claimed && failed()); });
  if (!req.done) withdraw(k, req);
  if (auto it = mailboxes.find(k);
      it != mailboxes.end() && it->second.waiting.empty() && it->second.arrived.empty())
    mailboxes.erase(it);
  if (!req.done) {
    // Failures never heal, so what woke us still holds and one of these throws.
    throw_if_failed(lock, op, one);
    throw_if_failed(lock, op, watch);
    throw std::logic_error(op + ": woken without a result or a failure");
  }
  if (req.error) {
    const int who = *req.error == transport_failure::aborted ? -1 : peer;
    throw transport_error(*req.error, who, op + ": " + req.error_reason);
  }
}

void host_transport::state::withdraw(const std::pair<int, std::uint64_t>& k, recv_request& req) {
  // Under mu. Not claimed: still queued in the mailbox (if it was ever posted), so taking it
  // out is all it takes.
  auto it = mailboxes.find(k);
  if (it == mailboxes.end()) return;
  auto& waiting = it->second.waiting;
  if (auto w = std::find(waiting.begin(), waiting.end(), &req); w != waiting.end()) waiting.erase(w);
  if (waiting.empty() && it->second.arrived.empty()) mailboxes.erase(it);
}

void host_transport::state::cancel_recv(int peer, std::uint64_t key, recv_request& req) {
  std::unique_lock lock(mu);
  if (req.done) return;
  if (!req.claimed) return withdraw({peer, key}, req);
  cv.wait(lock, [&] { return req.done; });  // the I/O thread finishes it (bounded, see above)
}

void host_transport::state::wait_recv(const std::string& op, int peer, std::uint64_t key,
                                      recv_request& req, std::span<const int> watch) {
  if (!post_recv(op, peer, key, req, watch)) wait_posted(op, peer, key, req, watch);
}

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

}  // namespace oobleck::runtime
