#pragma once
// The state behind host_transport. Private to the transport's .cpp files.
//
// Who touches what, by type:
// - const members and `bound_port`: fixed by the constructor, read by any thread;
// - guarded<...> (transport_shared here, link_shared in each link): under `mu`, reachable only
//   through a `locked` (transport_guarded.hpp); `cv` signals their changes;
// - io_side and each link's link_io: the I/O thread's alone (Asio objects are not
//   thread-safe). The constructor sets the acceptor up before the I/O thread starts;
// - recv_request: its own hand-over rule (transport_mailboxes.hpp).
// A sending thread that claimed link_shared::caller_writing writes to the link's descriptor
// with plain system calls (transport_link_write.cpp), and a waiting thread that claimed
// link_shared::caller_reading reads from it, with the link's read_state (transport_link_read.cpp);
// that is the only I/O outside the I/O thread.
//
// Files: host_transport.cpp (lifecycle, errors, p2p calls), transport_connect.cpp (mesh),
// transport_link_read.cpp, transport_link_write.cpp, transport_link_failure.cpp (a link's read
// and write state machines and its failure), transport_mailboxes.cpp (matching and waiting),
// transport_collectives.cpp, transport_shm.cpp (the all-reduce within one machine).

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "runtime/transport/buffer_pool.hpp"
#include "runtime/transport/host_transport.hpp"
#include "runtime/transport/transport_guarded.hpp"
#include "runtime/transport/transport_handshake.hpp"
#include "runtime/transport/transport_link.hpp"
#include "runtime/transport/transport_mailboxes.hpp"
#include "runtime/transport/transport_shm.hpp"
#include "runtime/transport/transport_wire.hpp"

namespace oobleck::runtime {

// A read or write pass of the I/O thread yields to the other links' handlers after moving this much.
inline constexpr std::size_t yield_after_bytes = std::size_t{8} << 20;

/// An accepted connection that has not proved who it is yet.
struct handshake {
  explicit handshake(tcp::socket s) : socket(std::move(s)), challenge(fresh_challenge()) {}
  tcp::socket socket;
  challenge_bytes challenge;  ///< this connection's own: the dialer's proof covers it
  std::array<std::byte, greeting_size> greeting;
  std::array<std::byte, hello_size> hello;
  std::array<std::byte, ack_size> ack;
};

/// What every thread may read and write: only under the mutex.
struct transport_shared {
  bool is_aborted = false;
  std::string abort_reason;
  bool sockets_closed = false;  ///< close_all() has run
  bool connect_started = false;
  int links_up = 0;
  mailboxes boxes;
};

/// The I/O thread's own state besides the links.
struct io_side {
  explicit io_side(asio::io_context& io) : acceptor(io) {}
  tcp::acceptor acceptor;
  std::vector<tcp::endpoint> endpoints;  ///< the lower ranks, resolved by connect()
  std::vector<std::weak_ptr<handshake>> handshakes;
  bool closed = false;  ///< close_all() has run: handlers stop
};

struct host_transport::state {
  explicit state(transport_config c);

  const transport_config config;
  const int world;
  const std::shared_ptr<buffer_pool> pool;  // thread-safe itself
  std::uint16_t bound_port = 0;

  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work;  // reset by the destructor

  mutable std::mutex mu;
  std::condition_variable cv;
  guarded<transport_shared> shared;
  io_side io_only;
  std::vector<link> links;  // indexed by rank; links[rank] unused
  std::mutex shm_mu;        // guards shm_channels (a channel itself is used by its collective's one caller)
  std::map<std::pair<std::vector<int>, std::uint32_t>, std::shared_ptr<shm_channel>> shm_channels;  // by (group, tag)
  std::atomic<std::uint64_t> ring_all_reduces{0}, shm_all_reduces{0};  // host_transport::all_reduce_counts
  std::atomic<std::uint64_t> waiting_reads{0};                          // host_transport::waiting_reads

  std::thread io_thread;  // last: started once everything above exists

  [[nodiscard]] locked lock() const { return locked(mu); }
  link& at(int peer) { return links[static_cast<std::size_t>(peer)]; }
  const link& at(int peer) const { return links[static_cast<std::size_t>(peer)]; }

  // --- lifecycle (host_transport.cpp)
  void abort(const std::string& reason);

  // --- mesh set-up (transport_connect.cpp)
  /// host_transport::connect() with these endpoints.
  void connect(const std::vector<peer_endpoint>& peers);
  void start_accept();                                   // I/O thread
  void on_hello(const std::shared_ptr<handshake>& h);    // I/O thread
  /// The status an accepted connection's hello earns; reserves the rank only when ok.
  handshake_status check_hello(const std::shared_ptr<handshake>& h);  // I/O thread
  void start_connect(int peer);                          // I/O thread
  void on_greeting(int peer);                            // I/O thread
  void on_ack(int peer);                                 // I/O thread
  void retry_connect(int peer, std::string why);         // I/O thread
  void link_up(int peer);                                // I/O thread
  /// host_transport::wait_connected.
  void wait_connected(int peer);

  // --- reading (transport_link_read.cpp), I/O thread
  void start_read(int peer);
  void read_pass(int peer);
  /// One readv from `fd` into the current body and the stage behind it, by whoever holds the
  /// read side; what it read is accounted (a body completed is finished). Returns readv's result,
  /// errno untouched when it is not positive.
  ssize_t read_once(int peer, int fd);
  /// Parses what the stage holds. A frame that breaks the protocol aborts the transport (on the
  /// I/O thread) or, with `violation` (a waiting thread's read), is described there. False then.
  bool consume_stage(int peer, std::string* violation = nullptr);
  /// A thread waiting awake for `req` (a message from `peer`) reads the link itself, if its read
  /// side is parked (any thread; "A waiting thread reads" in transport_link_read.cpp). True if
  /// it read anything.
  bool caller_read(int peer, const recv_request& req);
  /// The I/O thread's end of a waiting thread's read that failed (the link fails with its cause)
  /// or whose link failed meanwhile (the read state is dropped, the socket closed): the read side
  /// is released here.
  void take_failed_read(int peer, int error, const std::string& violation);  // I/O thread
  /// A peer broke the wire protocol (a frame too large, or of no known kind): the epoch's data
  /// plane cannot be trusted any more, so the transport aborts with `why`. Returns false.
  bool protocol_violation(int peer, const std::string& why);
  void begin_frame(int peer, std::uint64_t key, std::uint64_t size);
  void finish_frame(int peer);

  // --- writing (transport_link_write.cpp)
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
  /// The common part: `o` is a whole frame; `copying` copies what could not be written
  /// directly instead of keeping o.keep.
  void send_frame(const std::string& op, int peer, outgoing o, bool copying);
  void drain(int peer);  // I/O thread
  void flush(int peer);  // I/O thread

  // --- failures (transport_link_failure.cpp), I/O thread
  /// Marks the link broken, closes its socket and drops what it still had to send.
  void fail_link(int peer, boost::system::error_code ec, const std::string& detail = {});
  /// Fails the receive the link is reading into, if any, and drops its queues (the read state
  /// later, by drop_read_state, when a waiting thread holds it).
  void drop_link_io(link& l);
  /// The read side's part of it: idempotent.
  void drop_read_state(link& l);
  /// Closes the socket of a link whose failure was noticed while a caller wrote to it.
  void close_deferred_socket(int peer);
  /// abort()'s work: every link fails, every socket closes.
  void close_all();

  // --- receiving (transport_mailboxes.cpp)
  /// A complete message for (peer, key): answers the first waiting receive or keeps it.
  void deliver(int peer, std::uint64_t key, payload body);  // I/O thread
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

  // --- the all-reduce through shared memory (transport_shm.cpp)
  /// The shared-memory channel of (group, tag) for `count` floats, agreed with the other members
  /// on first use (and again when a larger piece is needed); not usable when the group keeps
  /// the ring. Every member of the group must call it at the same point of its collectives.
  std::shared_ptr<shm_channel> shm_channel_for(const std::string& op, std::span<const int> group, std::size_t pos,
                                               std::uint32_t tag, std::size_t count);
  /// A frame of the shared-memory protocol to every other member, and the next one from `member`.
  void shm_send_to_others(const std::string& op, std::span<const int> group, std::uint32_t tag,
                          std::span<const std::byte> body);
  payload shm_receive(const std::string& op, std::span<const int> group, int member, std::uint32_t tag);
  /// all_reduce_sum through `ch` (usable): the ring's sums, bit for bit.
  void shm_all_reduce(const std::string& op, std::span<const int> group, std::size_t pos, std::span<float> data,
                      std::uint32_t tag, shm_channel& ch);

  // --- errors (host_transport.cpp)
  /// Throws the error for `op` if the transport is aborted or a link in `peers` is broken, and
  /// std::logic_error if one is not up yet, unless `require_up` is false.
  void throw_if_failed(const locked& lock, const std::string& op,
                       std::span<const int> peers, bool require_up = true) const;
  void check_peer(const std::string& op, int peer) const;
};

std::string describe_group(std::span<const int> group);
/// The address of `p`, for rank `rank`; throws transport_error(connect_failed).
tcp::endpoint resolve(asio::io_context& io, const peer_endpoint& p, int rank, bool passive);

}  // namespace oobleck::runtime
