#pragma once
// Private to the transport's .cpp files: the state behind host_transport and the wire format.
//
// Ownership rule: the sockets, the acceptor, the timers and everything marked "I/O thread" are
// touched only by the I/O thread (Asio objects are not thread-safe); everything marked "guarded"
// is read and written under `mu`. A recv_request that the I/O thread has claimed is completed by
// the I/O thread only, which is what lets the I/O thread read straight into a user's buffer.

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

struct outgoing {
  std::array<std::byte, frame_header_size> header;
  payload body;
};

/// The connection to one peer.
struct link {
  // guarded
  bool up = false;
  bool broken = false;
  transport_failure failure = transport_failure::peer_lost;
  std::string failure_reason;
  std::deque<outgoing> outbox;  ///< sends accepted from user threads, not yet handed over
  bool drain_posted = false;
  std::string last_connect_error;
  bool handshaking = false;  ///< an accepted connection claims this rank

  // I/O thread
  std::unique_ptr<tcp::socket> socket;
  std::deque<outgoing> send_queue;  ///< front is being written
  bool writing = false;
  std::array<std::byte, frame_header_size> in_header;
  std::uint64_t in_key = 0;
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
  void on_header(int peer);                                 // I/O thread
  void on_body(int peer, boost::system::error_code ec);     // I/O thread
  void deliver(int peer, std::uint64_t key, payload body);  // I/O thread
  void drain(int peer);                                     // I/O thread
  void write_next(int peer);                                // I/O thread
  void fail_link(int peer, boost::system::error_code ec, const std::string& detail = {});

  /// Queues `body` for `peer` (any thread); throws if the link cannot carry it.
  void post_send(const std::string& op, int peer, std::uint64_t key, payload body);
  /// Blocks until the next message for (peer, key) completes `req`; a watched peer's loss, or an
  /// abort, fails the request while the I/O thread has not claimed it.
  void wait_recv(const std::string& op, int peer, std::uint64_t key, recv_request& req,
                 std::span<const int> watch);

  /// Throws the error for `op` if the transport is aborted or a link in `peers` is broken.
  void throw_if_failed(std::unique_lock<std::mutex>& lock, const std::string& op,
                       std::span<const int> peers) const;
  [[noreturn]] void throw_link_failure(const std::string& op, int peer) const;  // under mu
  void check_peer(const std::string& op, int peer) const;
};

std::string describe_group(std::span<const int> group);

}  // namespace oobleck::runtime
