// Matching messages to receives, and the waits. A message is kept in its mailbox until a
// receive asks for it; a receive is queued until its message comes, and the I/O thread then
// claims it: reads the body straight into its buffer (claim_direct, at the frame's header) or
// hands over a complete body (deliver). A receive that nobody claimed fails as soon as its peer,
// a watched peer, or the transport fails; a claimed one is finished by the I/O thread.

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

std::optional<payload> mailboxes::take_arrived(const mailbox_key& k) {
  auto it = boxes_.find(k);
  if (it == boxes_.end() || !it->second.waiting.empty() || it->second.arrived.empty())
    return std::nullopt;
  payload p = std::move(it->second.arrived.front());
  it->second.arrived.pop_front();
  if (it->second.arrived.empty()) boxes_.erase(it);
  return p;
}

void mailboxes::enqueue(const mailbox_key& k, recv_request& req) {
  boxes_[k].waiting.push_back(&req);
}

recv_request* mailboxes::claim_direct(const mailbox_key& k, std::size_t size) {
  auto it = boxes_.find(k);
  if (it == boxes_.end() || !it->second.arrived.empty() || it->second.waiting.empty())
    return nullptr;
  recv_request* r = it->second.waiting.front();
  if (!r->direct || r->out.size() != size) return nullptr;
  it->second.waiting.pop_front();
  r->stage = recv_stage::claimed;
  return r;
}

recv_request* mailboxes::claim_or_keep(const mailbox_key& k, payload& body) {
  box& b = boxes_[k];
  if (b.waiting.empty()) {
    b.arrived.push_back(std::move(body));
    return nullptr;
  }
  recv_request* r = b.waiting.front();
  b.waiting.pop_front();
  r->stage = recv_stage::claimed;
  return r;
}

void mailboxes::withdraw(const mailbox_key& k, recv_request& req) {
  auto it = boxes_.find(k);
  if (it == boxes_.end()) return;
  auto& waiting = it->second.waiting;
  if (auto w = std::find(waiting.begin(), waiting.end(), &req); w != waiting.end())
    waiting.erase(w);
  if (waiting.empty() && it->second.arrived.empty()) boxes_.erase(it);
}

void mailboxes::forget_if_empty(const mailbox_key& k) {
  if (auto it = boxes_.find(k);
      it != boxes_.end() && it->second.waiting.empty() && it->second.arrived.empty())
    boxes_.erase(it);
}

void host_transport::state::deliver(int peer, std::uint64_t key, payload body) {
  {
    auto lk = lock();
    recv_request* r = shared(lk).boxes.claim_or_keep({peer, key}, body);
    if (!r) return;
    if (r->take) {
      r->taken = std::move(body);
    } else if (r->out.size() != body.size) {
      r->error = transport_failure::mismatch;
      r->error_reason = "received " + std::to_string(body.size) + " bytes, expected " +
                        std::to_string(r->out.size());
    } else {
      // Claimed: nobody else touches r, so the copy runs without the lock.
      lk.unlocked([&] {
        if (body.size) std::memcpy(r->out.data(), body.data.get(), body.size);
      });
    }
    r->stage = recv_stage::done;
  }
  cv.notify_all();
}

bool host_transport::state::post_recv(const std::string& op, int peer, std::uint64_t key,
                                      recv_request& req, std::span<const int> watch) {
  const mailbox_key k{peer, key};
  const int one[1] = {peer};
  std::optional<payload> p;
  {
    auto lk = lock();
    transport_shared& sh = shared(lk);
    if (sh.is_aborted)
      throw transport_error(transport_failure::aborted, -1, op + ": " + sh.abort_reason);
    // A message that arrived whole is delivered even if its sender has died since.
    p = sh.boxes.take_arrived(k);
    if (!p) {
      throw_if_failed(lk, op, one, !req.early);
      throw_if_failed(lk, op, watch);
      sh.boxes.enqueue(k, req);
      return false;
    }
  }
  // Never queued: nobody else knows `req`.
  if (req.take) {
    req.taken = std::move(*p);
  } else if (p->size != req.out.size()) {
    throw transport_error(transport_failure::mismatch, peer,
                          op + ": received " + std::to_string(p->size) + " bytes, expected " +
                              std::to_string(req.out.size()));
  } else if (p->size) {
    std::memcpy(req.out.data(), p->data.get(), p->size);
  }
  req.stage = recv_stage::done;
  return true;
}

void host_transport::state::wait_posted(const std::string& op, int peer, std::uint64_t key,
                                        recv_request& req, std::span<const int> watch) {
  const mailbox_key k{peer, key};
  const int one[1] = {peer};
  auto lk = lock();
  auto failed = [&] {
    if (shared(lk).is_aborted || at(peer).shared(lk).broken) return true;
    return std::any_of(watch.begin(), watch.end(), [&](int w) {
      return w != config.rank && at(w).shared(lk).broken;
    });
  };
  const auto settled = [&] { return req.stage == recv_stage::done || (req.stage == recv_stage::open && failed()); };
  // Awake first (transport_config::spin_wait): reading the link itself whenever the I/O thread
  // is not (read_while_waiting), and otherwise yielding the core to the I/O thread that
  // completes the receive, or to any other thread that can run.
  if (config.spin_wait.count() > 0 && !settled()) {
    const auto until = std::chrono::steady_clock::now() + config.spin_wait;
    do {
      lk.unlocked([&] {
        if (!config.read_while_waiting || !caller_read(peer, req)) ::sched_yield();
      });
    } while (!settled() && std::chrono::steady_clock::now() < until);
  }
  // A claimed receive is completed by the I/O thread alone (it may be reading into req.out);
  // that takes at most the rest of one message, or until abort() closes its socket.
  lk.wait(cv, settled);
  mailboxes& boxes = shared(lk).boxes;
  if (req.stage != recv_stage::done) boxes.withdraw(k, req);
  boxes.forget_if_empty(k);
  if (req.stage != recv_stage::done) {
    // Failures never heal, so what woke us still holds and one of these throws.
    throw_if_failed(lk, op, one);
    throw_if_failed(lk, op, watch);
    throw std::logic_error(op + ": woken without a result or a failure");
  }
  if (req.error) {
    const int who = *req.error == transport_failure::aborted ? -1 : peer;
    throw transport_error(*req.error, who, op + ": " + req.error_reason);
  }
}

void host_transport::state::cancel_recv(int peer, std::uint64_t key, recv_request& req) {
  auto lk = lock();
  if (req.stage == recv_stage::done) return;
  if (req.stage == recv_stage::open) return shared(lk).boxes.withdraw({peer, key}, req);
  lk.wait(cv, [&] { return req.stage == recv_stage::done; });  // bounded, see wait_posted
}

void host_transport::state::wait_recv(const std::string& op, int peer, std::uint64_t key,
                                      recv_request& req, std::span<const int> watch) {
  if (!post_recv(op, peer, key, req, watch)) wait_posted(op, peer, key, req, watch);
}

}  // namespace oobleck::runtime
