// How links fail, on the I/O thread: one link when its peer goes away or its stream breaks
// (fail_link), every link when the transport is aborted (close_all). Either way the link is
// marked broken with its cause, its socket closes, what it had to send is dropped, and the
// receive it was reading into fails; waiters that see the broken link throw.

#include <string>
#include <vector>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

namespace {

std::string describe(int peer, boost::system::error_code ec) {
  const std::string who = "peer " + std::to_string(peer);
  if (ec == asio::error::eof) return who + " closed the connection";
  if (ec == asio::error::connection_reset) return who + " reset the connection";
  if (ec == asio::error::broken_pipe) return who + " closed the connection (broken pipe)";
  return "I/O error on the connection to " + who + ": " + ec.message();
}

/// Marks `l` failed and takes what it will never send; true if a sending thread is writing to
/// its descriptor or a waiting thread reading from it, which must then stay open until that
/// thread is done (a reader's end, take_failed_read, also drops the read state then).
bool break_link(link_shared& l, transport_failure failure, const std::string& reason,
                std::deque<outgoing>& dropped) {
  if (!l.broken) {
    l.broken = true;
    l.failure = failure;
    l.failure_reason = reason;
  }
  dropped.swap(l.outbox);
  l.user_fd = -1;
  l.read_parked = false;
  if (l.caller_writing || l.caller_reading) l.close_deferred = true;
  return l.caller_writing || l.caller_reading;
}

}  // namespace

void host_transport::state::fail_link(int peer, boost::system::error_code ec,
                                      const std::string& detail) {
  link& l = at(peer);
  std::deque<outgoing> dropped;  // released below, after the lock
  bool defer_close = false;
  {
    auto lk = lock();
    const transport_shared& sh = shared(lk);
    if (sh.is_aborted)
      defer_close = break_link(l.shared(lk), transport_failure::aborted, sh.abort_reason, dropped);
    else
      defer_close = break_link(l.shared(lk), transport_failure::peer_lost,
                               detail.empty() ? describe(peer, ec) : detail, dropped);
  }
  cv.notify_all();
  boost::system::error_code ignored;
  if (l.io.socket) {
    if (defer_close) {
      l.io.socket->shutdown(tcp::socket::shutdown_both, ignored);  // the writer fails at once
      l.io.socket->cancel(ignored);
    } else {
      l.io.socket->close(ignored);  // pending waits complete with an error and stop
    }
  }
  l.io.fd = -1;
  drop_link_io(l);
}

void host_transport::state::close_deferred_socket(int peer) {
  link_io& l = at(peer).io;
  boost::system::error_code ignored;
  if (l.socket) l.socket->close(ignored);
}

void host_transport::state::drop_link_io(link& l) {
  // The send queue's bytes are no longer referenced by any system call: release them (oldest
  // first, so keep-alives are released in send order).
  l.io.out.queue.clear();
  {
    auto lk = lock();
    if (l.shared(lk).caller_reading) return;  // dropped at the reader's end (take_failed_read)
  }
  drop_read_state(l);
}

void host_transport::state::drop_read_state(link& l) {
  read_state& in = l.io.in;
  in.in_frame = false;
  in.target = {};
  in.body = {};
  in.stage_begin = in.stage_end = 0;
  if (recv_request* direct = std::exchange(in.direct, nullptr)) {
    {
      auto lk = lock();
      const link_shared& ls = l.shared(lk);
      direct->error = ls.failure;
      direct->error_reason = ls.failure_reason;
      direct->stage = recv_stage::done;
    }
    cv.notify_all();
  }
}

void host_transport::state::close_all() {
  if (io_only.closed) return;
  io_only.closed = true;
  boost::system::error_code ignored;
  io_only.acceptor.close(ignored);
  for (auto& h : io_only.handshakes)
    if (auto alive = h.lock()) alive->socket.close(ignored);
  io_only.handshakes.clear();
  // Pieces nobody will write; released after the lock, since a keep-alive's deleter may run
  // caller code.
  std::vector<std::deque<outgoing>> dropped(links.size());
  std::vector<char> defer_close(links.size(), 0);
  {
    auto lk = lock();
    const std::string& reason = shared(lk).abort_reason;
    for (std::size_t p = 0; p < links.size(); ++p)
      defer_close[p] =
          break_link(links[p].shared(lk), transport_failure::aborted, reason, dropped[p]);
  }
  for (std::size_t p = 0; p < links.size(); ++p) {
    link_io& l = links[p].io;
    if (l.dial.retry_timer) l.dial.retry_timer->cancel();
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
    auto lk = lock();
    shared(lk).sockets_closed = true;
  }
  cv.notify_all();
}

}  // namespace oobleck::runtime
