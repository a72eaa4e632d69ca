#pragma once
// The connection to one peer: what user threads share with the I/O thread (under the mutex) and
// what the I/O thread keeps to itself (the socket, the read and write state machines).
// Private to the transport's .cpp files.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>

#include "runtime/transport/buffer_pool.hpp"
#include "runtime/transport/host_transport.hpp"
#include "runtime/transport/transport_guarded.hpp"
#include "runtime/transport/transport_handshake.hpp"
#include "runtime/transport/transport_mailboxes.hpp"
#include "runtime/transport/transport_wire.hpp"

namespace oobleck::runtime {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// A piece of an outgoing byte stream: a frame header and/or (part of) a frame body. The body
/// is written straight from `data`; `keep` owns those bytes (a pooled copy, a collective's
/// completion tracker, or the caller's keep-alive) and is released once the piece has been
/// written or dropped. Never released under the mutex: its deleter may run caller code.
struct outgoing {
  std::array<std::byte, frame_header_size> header;
  bool has_header = false;  ///< false: a continuation of the frame of the piece before it
  const std::byte* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<const void> keep;
  std::size_t written = 0;  ///< bytes of header and body already written
  [[nodiscard]] std::size_t total() const { return (has_header ? frame_header_size : 0) + size; }
};

/// The part of a link that user threads read and write too: only under the mutex.
struct link_shared {
  bool up = false;
  bool broken = false;
  transport_failure failure = transport_failure::peer_lost;
  std::string failure_reason;
  std::deque<outgoing> outbox;  ///< pieces accepted from user threads, not yet handed over
  bool drain_posted = false;
  std::string last_connect_error;
  bool handshaking = false;  ///< an accepted connection proved the key and claims this rank

  // Who writes to the socket: the I/O thread while it has pieces (io_busy), or else one sending
  // thread directly (caller_writing), which saves a copy and a thread hand-off. Pieces queued in
  // the outbox meanwhile wait until the writer is done. The writing thread uses the descriptor
  // with plain system calls; meanwhile the I/O thread neither writes to that socket nor closes
  // it (it only shuts it down), so the descriptor cannot be reused under the writer.
  bool io_busy = false;         ///< the I/O thread's send queue is not empty
  bool caller_writing = false;  ///< a sending thread is writing a frame to user_fd
  bool close_deferred = false;  ///< the link failed meanwhile: close once the callers are done
  int user_fd = -1;             ///< the descriptor, for direct writes and reads (-1 once failed)

  // Who reads from the socket: the I/O thread, or, while the I/O thread's read side is parked
  // (it read everything there was and waits for the next edge), a thread waiting awake for a
  // message of this link (caller_reading), which saves the I/O thread's wake-up and a hand-off
  // on the message's way (transport_link_read.cpp, "A waiting thread reads").
  bool read_parked = false;          ///< the I/O thread read until EAGAIN and waits for an edge
  bool caller_reading = false;       ///< a waiting thread has the read side (read_state)
  bool read_wanted = false;          ///< the I/O thread's wait fired meanwhile: it reads again after
};

/// The incoming stream's state machine: between frames, or inside a body that goes to
/// `target`. Bytes read past the current body wait in `stage`. The I/O thread's, except while
/// a waiting thread holds link_shared::caller_reading.
struct read_state {
  std::unique_ptr<std::byte[]> stage;
  std::size_t stage_begin = 0, stage_end = 0;
  bool in_frame = false;         ///< a header was parsed and its body is being received
  std::uint64_t key = 0;
  std::span<std::byte> target;   ///< where the body goes: a claimed receive's buffer or `body`
  std::size_t done = 0;          ///< body bytes received so far
  payload body;
  recv_request* direct = nullptr;  ///< the claimed receive being read into, if any
  bool wait_armed = false;         ///< the I/O thread's wait for an edge is pending (I/O thread only)
};

/// The outgoing stream's state machine: idle, writing (`queue` not empty), or waiting for the
/// socket to take more (`waiting`) or for its turn after other handlers (`posted`).
struct write_state {
  std::deque<outgoing> queue;  ///< front is being written
  bool waiting = false;        ///< waiting for the socket to accept more bytes
  bool posted = false;         ///< a flush is queued (it yielded to other work)
};

/// Connecting to a lower rank, retried until the mesh is up or connect() gives up.
struct connect_state {
  std::unique_ptr<asio::steady_timer> retry_timer;
  std::array<std::byte, greeting_size> greeting;
  std::array<std::byte, hello_size> hello;
  std::array<std::byte, ack_size> ack;
  challenge_bytes acceptor_challenge{};  ///< of the attempt under way
  challenge_bytes dialer_challenge{};
  /// Doubles per attempt up to 200 ms. It starts short: in a new epoch every rank connects at
  /// once, the lower ranks' listeners come up within milliseconds of each other, and a refused
  /// loopback or LAN connect costs microseconds; starting at 10 ms made every mesh wait ~10 ms.
  std::chrono::milliseconds retry_delay{1};
};

/// The I/O thread's part of a link (Asio objects are not thread-safe; no lock needed).
struct link_io {
  std::unique_ptr<tcp::socket> socket;
  int fd = -1;  ///< the socket's descriptor once the link is up
  read_state in;
  write_state out;
  connect_state dial;
};

/// The connection to one peer.
struct link {
  guarded<link_shared> shared;
  link_io io;
};

}  // namespace oobleck::runtime
