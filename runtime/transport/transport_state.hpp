#pragma once
// Private to the transport's .cpp files: the state behind host_transport and the wire format.
//
// Ownership rule: the sockets, the acceptor, the timers and everything marked "I/O thread" are
// touched only by the I/O thread (Asio objects are not thread-safe); everything marked "guarded"
// is read and written under `mu`. A recv_request that the I/O thread has claimed is completed by
// the I/O thread only, which is what lets the I/O thread read straight into a user's buffer.
// One exception to the first rule: a sending thread that claimed link::caller_writing (under
// `mu`, on an idle link) writes to the link's descriptor with plain system calls; meanwhile the
// I/O thread neither writes to that socket nor closes it (it only shuts it down), so the
// descriptor cannot be reused under the writer.

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "runtime/transport/buffer_pool.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// Frame keys put the channel in the high half so collectives never see point-to-point tags.
enum class channel : std::uint32_t { p2p = 0, all_reduce = 1, broadcast = 2 };
inline std::uint64_t frame_key(channel c, std::uint32_t tag) {
  return (static_cast<std::uint64_t>(c) << 32) | tag;
}

// Every frame: key (u64) then body length (u64), little-endian, then the body.
inline constexpr std::size_t frame_header_size = 16;
// A length above this is a corrupt stream, not a message.
inline constexpr std::uint64_t max_frame_bytes = std::uint64_t{1} << 38;
// Handshake: magic, version, epoch, rank, world size (connector -> acceptor); magic, status,
// epoch (acceptor -> connector).
inline constexpr std::uint32_t handshake_magic = 0x4f42'5450;  // "OBTP"
inline constexpr std::uint32_t handshake_version = 1;
inline constexpr std::size_t hello_size = 24;
inline constexpr std::size_t ack_size = 16;
enum class handshake_status : std::uint32_t {
  ok = 0,
  wrong_epoch = 1,
  bad_rank = 2,
  duplicate = 3
};

void put_u32(std::byte* at, std::uint32_t v);
void put_u64(std::byte* at, std::uint64_t v);
std::uint32_t get_u32(const std::byte* at);
std::uint64_t get_u64(const std::byte* at);

/// A receive waiting in a mailbox. Lives on the waiting thread's stack.
struct recv_request {
  std::span<std::byte> out;  ///< destination when copying
  bool direct = false;       ///< the I/O thread may read the body straight into `out`
  bool take = false;         ///< hand the body over in `taken` instead of copying it
  payload taken;
  bool claimed = false;  ///< the I/O thread owns the request and alone completes it
  bool done = false;
  std::optional<transport_failure> error;
  std::string error_reason;
};

struct mailbox {
  std::deque<payload> arrived;        ///< complete messages nobody asked for yet
  std::deque<recv_request*> waiting;  ///< receives nobody answered yet (one side is empty)
};

/// A piece of an outgoing byte stream: a frame header and/or (part of) a frame body. The body
/// is written straight from `data`; `keep` owns those bytes (a pooled copy, a collective's
/// completion tracker, or the caller's keep-alive) and is released once the piece has been
/// written or dropped. Never released while `mu` is held: its deleter may run caller code.
struct outgoing {
  std::array<std::byte, frame_header_size> header;
  bool has_header = false;  ///< false: a continuation of the frame of the piece before it
  const std::byte* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<const void> keep;
  std::size_t written = 0;  ///< bytes of header and body already written
  [[nodiscard]] std::size_t total() const { return (has_header ? frame_header_size : 0) + size; }
};

/// The connection to one peer.
struct link {
  // guarded
  bool up = false;
  bool broken = false;
  transport_failure failure = transport_failure::peer_lost;
  std::string failure_reason;
  std::deque<outgoing> outbox;  ///< pieces accepted from user threads, not yet handed over
  bool drain_posted = false;
  std::string last_connect_error;
  bool handshaking = false;  ///< an accepted connection claims this rank

  // Who writes to the socket: the I/O thread while it has pieces (io_busy), or else one sending
  // thread directly (caller_writing), which saves a copy and a thread hand-off. Pieces queued in
  // the outbox meanwhile wait until the writer is done.
  bool io_busy = false;         ///< the I/O thread's send_queue is not empty
  bool caller_writing = false;  ///< a sending thread is writing a frame to user_fd
  bool close_deferred = false;  ///< the link failed meanwhile: close once the caller is done
  int user_fd = -1;             ///< the descriptor, for direct writes (-1 once failed)

  // I/O thread
  std::unique_ptr<tcp::socket> socket;
  int fd = -1;                      ///< the socket's descriptor once the link is up
  std::deque<outgoing> send_queue;  ///< front is being written
  bool write_waiting = false;       ///< waiting for the socket to accept more bytes
  bool write_posted = false;        ///< a flush is queued (it yielded to other work)
  // Incoming stream. Bytes read past the current frame's body wait in `stage`.
  std::unique_ptr<std::byte[]> stage;
  std::size_t stage_begin = 0, stage_end = 0;
  bool in_frame = false;           ///< a header was parsed and its body is being received
  std::uint64_t in_key = 0;
  std::span<std::byte> in_target;  ///< where the body goes: a claimed receive's buffer or in_body
  std::size_t in_done = 0;         ///< body bytes received so far
  payload in_body;
  recv_request* in_direct = nullptr;
  std::unique_ptr<asio::steady_timer> retry_timer;
  std::array<std::byte, hello_size> hello;
  std::array<std::byte, ack_size> ack;
  std::chrono::milliseconds retry_delay{10};
};

/// An accepted connection that has not said who it is yet.
struct handshake {
  explicit handshake(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::array<std::byte, hello_size> hello;
  std::array<std::byte, ack_size> ack;
};

struct host_transport::state {
  explicit state(transport_config c);

  transport_config config;
  int world = 0;

  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work;
  tcp::acceptor acceptor;
  std::uint16_t bound_port = 0;
  std::shared_ptr<buffer_pool> pool;
  std::vector<tcp::endpoint> endpoints;              // resolved peers, filled by connect()
  std::vector<std::weak_ptr<handshake>> handshakes;  // I/O thread
  bool io_closed = false;                            // I/O thread: close_all ran

  mutable std::mutex mu;
  std::condition_variable cv;
  bool is_aborted = false;       // guarded
  std::string abort_reason;      // guarded
  bool sockets_closed = false;   // guarded
  bool connect_started = false;  // guarded
  int links_up = 0;              // guarded
  std::vector<link> links;       // indexed by rank; links[rank] unused
  std::map<std::pair<int, std::uint64_t>, mailbox> mailboxes;  // guarded

  std::thread io_thread;  // last: started once everything above exists

  // --- lifecycle (host_transport.cpp)
  void abort(const std::string& reason);
  void close_all();  // I/O thread

  // --- mesh set-up (transport_connect.cpp), I/O thread
  void start_accept();
  void on_hello(const std::shared_ptr<handshake>& h);
  void start_connect(int peer);
  void retry_connect(int peer, std::string why);
  void link_up(int peer);

  // --- data path (transport_io.cpp)
  void start_read(int peer);                                // I/O thread
  void read_pass(int peer);                                 // I/O thread
  bool consume_stage(int peer);                             // I/O thread
  void begin_frame(int peer, std::uint64_t key, std::uint64_t size);  // I/O thread
  void finish_frame(int peer);                              // I/O thread
  void deliver(int peer, std::uint64_t key, payload body);  // I/O thread
  void drain(int peer);                                     // I/O thread
  void flush(int peer);                                     // I/O thread
  /// Marks the link broken, closes its socket and drops what it still had to send. I/O thread.
  void fail_link(int peer, boost::system::error_code ec, const std::string& detail = {});
  /// Fails the receive the link is reading into, if any, and drops its queues. I/O thread.
  void drop_link_io(link& l);

  /// Sends one frame whose body is written straight from `body` (any thread): directly from
  /// this thread for as long as the socket takes it without waiting when the link is idle,
  /// else (and for the rest) by the I/O thread. `keep` owns the bytes and is released once they
  /// are written or dropped. Throws (releasing `keep`) if the link cannot carry it.
  void post_frame(const std::string& op, int peer, std::uint64_t key,
                  std::span<const std::byte> body, std::shared_ptr<const void> keep);
  /// Sends one frame of `bytes` that the caller may reuse on return: written directly while the
  /// link is idle and the receiver keeps up; what is left is copied and queued.
  void post_copy(const std::string& op, int peer, std::uint64_t key,
                 std::span<const std::byte> bytes);
  /// Sends one frame whose body is `body` (shared, never modified again).
  void post_payload(const std::string& op, int peer, std::uint64_t key, const payload& body);
  /// The common part: `o` is a whole frame; `copy_rest` copies what could not be written
  /// directly (the copying send) instead of keeping o.keep.
  void send_frame(const std::string& op, int peer, outgoing o, bool copying);
  /// Closes the socket of a link whose failure was noticed while a caller wrote to it. I/O thread.
  void close_deferred_socket(int peer);
  /// Blocks until the next message for (peer, key) completes `req`; a watched peer's loss, or an
  /// abort, fails the request while the I/O thread has not claimed it.
  void wait_recv(const std::string& op, int peer, std::uint64_t key, recv_request& req,
                 std::span<const int> watch);
  /// The two halves of wait_recv, so that a collective can have several receives posted (and
  /// read straight into place) while it waits for the first. post_recv completes `req` from a
  /// message that already arrived (true) or queues it (false); it throws like wait_recv. A
  /// queued request must be waited for with wait_posted, or cancelled with cancel_recv, before
  /// it goes away.
  bool post_recv(const std::string& op, int peer, std::uint64_t key, recv_request& req,
                 std::span<const int> watch);
  void wait_posted(const std::string& op, int peer, std::uint64_t key, recv_request& req,
                   std::span<const int> watch);
  /// Withdraws a queued request, or waits until the I/O thread has finished one it claimed.
  /// Never throws.
  void cancel_recv(int peer, std::uint64_t key, recv_request& req);
  void withdraw(const std::pair<int, std::uint64_t>& k, recv_request& req);  // under mu

  /// Throws the error for `op` if the transport is aborted or a link in `peers` is broken.
  void throw_if_failed(std::unique_lock<std::mutex>& lock, const std::string& op,
                       std::span<const int> peers) const;
  [[noreturn]] void throw_link_failure(const std::string& op, int peer) const;  // under mu
  void check_peer(const std::string& op, int peer) const;
};

std::string describe_group(std::span<const int> group);

}  // namespace oobleck::runtime
