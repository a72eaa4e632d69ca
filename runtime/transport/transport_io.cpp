// The data path: per-link read loop and write queue on the I/O thread, mailboxes matching
// messages to receives, and the point-to-point send()/recv().

#include <algorithm>
#include <cstring>

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

std::string with_tag(const std::string& what, int peer, std::uint32_t tag) {
  return what + " peer " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

}  // namespace

void host_transport::state::start_read(int peer) {
  if (io_closed) return;
  link& l = links[static_cast<std::size_t>(peer)];
  asio::async_read(*l.socket, asio::buffer(l.in_header),
                   [this, peer](boost::system::error_code ec, std::size_t) {
                     if (ec) return fail_link(peer, ec);
                     on_header(peer);
                   });
}

void host_transport::state::on_header(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  const std::uint64_t key = get_u64(l.in_header.data());
  const std::uint64_t size = get_u64(l.in_header.data() + 8);
  if (size > max_frame_bytes)
    return fail_link(peer, {},
                     "protocol error: peer " + std::to_string(peer) + " sent a frame of " +
                         std::to_string(size) + " bytes");
  l.in_key = key;
  std::span<std::byte> target;
  {
    // A receive already waiting for exactly this message gets the bytes straight from the
    // socket: no 64 MiB intermediate buffer and no copy.
    std::lock_guard lock(mu);
    auto it = mailboxes.find({peer, key});
    if (it != mailboxes.end() && it->second.arrived.empty() && !it->second.waiting.empty()) {
      recv_request* r = it->second.waiting.front();
      if (r->direct && r->out.size() == size) {
        it->second.waiting.pop_front();
        r->claimed = true;
        l.in_direct = r;
        target = r->out;
      }
    }
  }
  if (!l.in_direct) {
    l.in_body = pool->allocate(static_cast<std::size_t>(size));
    target = l.in_body.bytes();
  }
  asio::async_read(*l.socket, asio::buffer(target.data(), target.size()),
                   [this, peer](boost::system::error_code ec, std::size_t) { on_body(peer, ec); });
}

void host_transport::state::on_body(int peer, boost::system::error_code ec) {
  link& l = links[static_cast<std::size_t>(peer)];
  recv_request* direct = std::exchange(l.in_direct, nullptr);
  if (ec) fail_link(peer, ec);
  if (direct) {
    {
      std::lock_guard lock(mu);
      if (ec) {
        direct->error = l.failure;
        direct->error_reason = l.failure_reason;
      }
      direct->done = true;
    }
    cv.notify_all();
  }
  if (ec) return;
  if (!direct) deliver(peer, l.in_key, std::move(l.in_body));
  start_read(peer);
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

void host_transport::state::fail_link(int peer, boost::system::error_code ec,
                                      const std::string& detail) {
  link& l = links[static_cast<std::size_t>(peer)];
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
    l.outbox.clear();
  }
  cv.notify_all();
  boost::system::error_code ignored;
  if (l.socket) l.socket->close(ignored);  // a pending write completes with an error and stops
  if (!l.writing) l.send_queue.clear();
}

void host_transport::state::drain(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  bool broken = false;
  {
    std::lock_guard lock(mu);
    l.drain_posted = false;
    broken = l.broken;
    for (auto& o : l.outbox) l.send_queue.push_back(std::move(o));
    l.outbox.clear();
  }
  if (io_closed || broken) {
    if (!l.writing) l.send_queue.clear();
    return;
  }
  if (!l.writing) write_next(peer);
}

void host_transport::state::write_next(int peer) {
  link& l = links[static_cast<std::size_t>(peer)];
  if (l.send_queue.empty()) {
    l.writing = false;
    return;
  }
  l.writing = true;
  // deque::push_back keeps references to the front valid while it is being written.
  outgoing& front = l.send_queue.front();
  std::array<asio::const_buffer, 2> buffers{asio::buffer(front.header),
                                            asio::buffer(front.body.data.get(), front.body.size)};
  asio::async_write(*l.socket, buffers, [this, peer](boost::system::error_code ec, std::size_t) {
    link& l = links[static_cast<std::size_t>(peer)];
    l.writing = false;
    if (ec || io_closed) {
      l.send_queue.clear();
      if (ec) fail_link(peer, ec);
      return;
    }
    l.send_queue.pop_front();
    write_next(peer);
  });
}

void host_transport::state::post_send(const std::string& op, int peer, std::uint64_t key,
                                      payload body) {
  outgoing o;
  put_u64(o.header.data(), key);
  put_u64(o.header.data() + 8, body.size);
  o.body = std::move(body);
  bool post = false;
  {
    std::unique_lock lock(mu);
    const int one[1] = {peer};
    throw_if_failed(lock, op, one);
    link& l = links[static_cast<std::size_t>(peer)];
    l.outbox.push_back(std::move(o));
    post = !std::exchange(l.drain_posted, true);
  }
  // The outbox, not the post, fixes the order, so concurrent senders cannot reorder a stream.
  if (post) asio::post(io, [this, peer] { drain(peer); });
}

void host_transport::state::wait_recv(const std::string& op, int peer, std::uint64_t key,
                                      recv_request& req, std::span<const int> watch) {
  const std::pair<int, std::uint64_t> k{peer, key};
  const int one[1] = {peer};
  std::unique_lock lock(mu);
  if (is_aborted) throw transport_error(transport_failure::aborted, -1, op + ": " + abort_reason);
  auto take_arrived = [&] {
    auto it = mailboxes.find(k);
    if (it == mailboxes.end() || !it->second.waiting.empty() || it->second.arrived.empty())
      return false;
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
    return true;
  };
  // A message that arrived whole is delivered even if its sender has died since.
  if (take_arrived()) return;
  throw_if_failed(lock, op, one);
  throw_if_failed(lock, op, watch);

  mailboxes[k].waiting.push_back(&req);
  auto failed = [&] {
    if (is_aborted || links[static_cast<std::size_t>(peer)].broken) return true;
    return std::any_of(watch.begin(), watch.end(), [&](int w) {
      return w != config.rank && links[static_cast<std::size_t>(w)].broken;
    });
  };
  cv.wait(lock, [&] { return req.done || (!req.claimed && failed()); });
  auto it = mailboxes.find(k);
  if (!req.done) {
    // Not claimed: still queued in the mailbox, so withdrawing it is all it takes.
    auto& waiting = it->second.waiting;
    waiting.erase(std::find(waiting.begin(), waiting.end(), &req));
  }
  if (it != mailboxes.end() && it->second.waiting.empty() && it->second.arrived.empty())
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

void host_transport::send(int peer, std::uint32_t tag, std::span<const std::byte> bytes) {
  const std::string op = with_tag("send to", peer, tag);
  state_->check_peer(op, peer);
  state_->post_send(op, peer, frame_key(channel::p2p, tag), state_->pool->copy_of(bytes));
}

void host_transport::recv(int peer, std::uint32_t tag, std::span<std::byte> out) {
  const std::string op = with_tag("recv from", peer, tag);
  state_->check_peer(op, peer);
  recv_request req;
  req.out = out;
  req.direct = true;  // only `peer` is watched, so only its link can hold this buffer
  state_->wait_recv(op, peer, frame_key(channel::p2p, tag), req, {});
}

}  // namespace oobleck::runtime
