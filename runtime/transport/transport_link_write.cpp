// A link's outgoing stream: frames written by the sending thread itself while the link is idle
// (no hand-off, and for copying sends no copy), else queued in the link's outbox for the I/O
// thread, which gathers as many pieces as it has into one sendmsg and moves as much as the
// kernel takes per call.
//
// The outbox, under the mutex, fixes the order of frames on a link; link_shared says who may
// write to the socket at a time (transport_link.hpp).

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

namespace {

// Pieces gathered into one sendmsg.
constexpr std::size_t max_iov = 64;
// A zero-copy send or a collective's segment written from the sending thread (link idle) moves
// at most this much there, a few tens of microseconds of copying into the kernel; the I/O
// thread writes the rest, so the sender goes back to computing.
constexpr std::size_t direct_budget = std::size_t{256} << 10;
// A copying send that finds the socket full copies a rest this small at once.
constexpr std::size_t small_rest = std::size_t{256} << 10;

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

/// A whole frame of `body` with key `key`; the body is not copied.
outgoing frame(std::uint64_t key, std::span<const std::byte> body) {
  outgoing o;
  o.has_header = true;
  put_u64(o.header.data(), key);
  put_u64(o.header.data() + 8, body.size());
  o.data = body.data();
  o.size = body.size();
  return o;
}

}  // namespace

void host_transport::state::drain(int peer) {
  {
    auto lk = lock();
    at(peer).shared(lk).drain_posted = false;
  }
  flush(peer);
}

void host_transport::state::flush(int peer) {
  link& l = at(peer);
  write_state& out = l.io.out;
  if (out.waiting) return;  // the wait's handler flushes
  std::size_t moved = 0;
  for (;;) {
    if (io_only.closed || l.io.fd < 0) return;
    {
      // Pick up what user threads queued meanwhile, so one sendmsg carries as much as it can;
      // the moved-from pieces own nothing, so clearing them under the lock releases nothing.
      auto lk = lock();
      link_shared& ls = l.shared(lk);
      if (ls.caller_writing) {
        // A sending thread has the socket (it started while this queue was empty); it posts a
        // drain for what was queued behind it when it is done.
        ls.io_busy = false;
        return;
      }
      for (auto& p : ls.outbox) out.queue.push_back(std::move(p));
      ls.outbox.clear();
      ls.io_busy = !out.queue.empty();
    }
    if (out.queue.empty()) return;
    std::array<iovec, max_iov> iov{};
    std::size_t count = 0;
    for (auto it = out.queue.begin(); it != out.queue.end() && count + 2 <= max_iov; ++it)
      count += static_cast<std::size_t>(unwritten(*it, iov.data() + count));
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = count;
    const ssize_t n = ::sendmsg(l.io.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        out.waiting = true;
        l.io.socket->async_wait(tcp::socket::wait_write, [this, peer](auto ec) {
          at(peer).io.out.waiting = false;
          if (ec || io_only.closed) return;
          flush(peer);
        });
        return;
      }
      return fail_link(peer, boost::system::error_code(errno, asio::error::get_system_category()));
    }
    // Release what was written completely (the caller's keep-alive goes here).
    std::size_t left = static_cast<std::size_t>(n);
    while (!out.queue.empty()) {
      outgoing& front = out.queue.front();
      const std::size_t rest = front.total() - front.written;
      if (left < rest) {
        front.written += left;
        break;
      }
      left -= rest;
      out.queue.pop_front();
    }
    moved += static_cast<std::size_t>(n);
    if (moved >= yield_after_bytes) {
      if (!out.posted) {
        out.posted = true;
        asio::post(io, [this, peer] {
          at(peer).io.out.posted = false;
          flush(peer);
        });
      }
      return;
    }
  }
}

void host_transport::state::send_frame(const std::string& op, int peer, outgoing o,
                                       bool copying) {
  link& l = at(peer);
  const int one[1] = {peer};
  int fd = -1;
  bool post = false;
  {
    auto lk = lock();
    throw_if_failed(lk, op, one);  // `o` (and its keep-alive) is released after the lock
    link_shared& ls = l.shared(lk);
    if (ls.user_fd >= 0 && !ls.caller_writing && !ls.io_busy && ls.outbox.empty()) {
      // The link is idle: write from this thread, no hand-off and (for copying) no copy.
      ls.caller_writing = true;
      fd = ls.user_fd;
    } else if (!copying) {
      ls.outbox.push_back(std::move(o));
      post = !std::exchange(ls.drain_posted, true);
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
    auto lk = lock();
    dead = l.shared(lk).broken;  // aborted meanwhile: nothing to copy
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
    auto lk = lock();
    link_shared& ls = l.shared(lk);
    if (fd >= 0) {
      ls.caller_writing = false;
      close_now = !ls.caller_reading && std::exchange(ls.close_deferred, false);
      // The rest goes before whatever others queued while this thread wrote; on a failed link
      // it is dropped (the failure surfaces on later operations).
      if (o.written < o.total() && !ls.broken) ls.outbox.push_front(std::move(o));
    } else {
      throw_if_failed(lk, op, one);
      ls.outbox.push_back(std::move(o));
    }
    post = !ls.outbox.empty() && !std::exchange(ls.drain_posted, true);
  }
  if (post) asio::post(io, [this, peer] { drain(peer); });
  if (close_now) asio::post(io, [this, peer] { close_deferred_socket(peer); });
}

void host_transport::state::post_frame(const std::string& op, int peer, std::uint64_t key,
                                       std::span<const std::byte> body,
                                       std::shared_ptr<const void> keep) {
  outgoing o = frame(key, body);
  o.keep = std::move(keep);
  send_frame(op, peer, std::move(o), false);
}

void host_transport::state::post_payload(const std::string& op, int peer, std::uint64_t key,
                                         const payload& body) {
  post_frame(op, peer, key, body.bytes(), body.data);
}

void host_transport::state::post_copy(const std::string& op, int peer, std::uint64_t key,
                                      std::span<const std::byte> bytes) {
  send_frame(op, peer, frame(key, bytes), true);
}

}  // namespace oobleck::runtime
