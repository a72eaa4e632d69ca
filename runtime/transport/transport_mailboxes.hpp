#pragma once
// Matching messages to receives: per (peer, frame key), the messages that arrived before anyone
// asked for them, or the receives that wait for a message. Private to the transport's .cpp files.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "runtime/transport/buffer_pool.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime {

/// open -> claimed -> done, or open -> done (completed from a message that had arrived, or
/// withdrawn before anyone claimed it).
enum class recv_stage { open, claimed, done };

/// A receive; lives on the receiving thread's stack. Who may touch it changes with its stage:
/// - before it is posted, the receiving thread's alone; `out`, `direct` and `take` are fixed then
///   and only read afterwards;
/// - open (posted): reachable only through the mailboxes, hence only under the transport's mutex;
/// - claimed: taken out of its mailbox by the I/O thread, which alone writes its bytes (into
///   `out`, or `taken`) and its outcome, and sets `done` under the mutex;
/// - done: the receiving thread's again.
struct recv_request {
  std::span<std::byte> out;  ///< destination when copying
  bool direct = false;       ///< the I/O thread may read the body straight into `out`
  bool take = false;         ///< hand the body over in `taken` instead of copying it
  bool early = false;        ///< may be posted before its link is up (recv_all)
  recv_stage stage = recv_stage::open;
  payload taken;
  std::optional<transport_failure> error;
  std::string error_reason;
};

/// (peer, frame key)
using mailbox_key = std::pair<int, std::uint64_t>;

/// Every (peer, key)'s messages and receives. Part of the transport's state under its mutex:
/// every method runs under it. Messages of one key are handed out in arrival order, receives
/// are answered in posting order.
class mailboxes {
 public:
  /// The oldest message that arrived for `k`, unless a receive waits ahead of it.
  std::optional<payload> take_arrived(const mailbox_key& k);
  /// Queues `req` (open) behind the receives already waiting for `k`.
  void enqueue(const mailbox_key& k, recv_request& req);
  /// The first receive waiting for `k`, claimed and dequeued, if the next message (a body of
  /// `size` bytes) is its own and may be read straight into its buffer; else null.
  recv_request* claim_direct(const mailbox_key& k, std::size_t size);
  /// The first receive waiting for `k`, claimed and dequeued, for the whole message `body`;
  /// if none waits, `body` is kept for a later receive and the result is null.
  recv_request* claim_or_keep(const mailbox_key& k, payload& body);
  /// Takes `req` out of the queue of `k`, if it is there.
  void withdraw(const mailbox_key& k, recv_request& req);
  /// Forgets the box of `k` if it holds nothing.
  void forget_if_empty(const mailbox_key& k);

 private:
  struct box {
    std::deque<payload> arrived;        ///< complete messages nobody asked for yet
    std::deque<recv_request*> waiting;  ///< receives nobody answered yet (one side is empty)
  };
  std::map<mailbox_key, box> boxes_;
};

}  // namespace oobleck::runtime
