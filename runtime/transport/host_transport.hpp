#pragma once
// Host (CPU) data plane between worker processes: framed point-to-point messages, a ring
// all-reduce and a broadcast on raw bytes/floats over TCP, with an abort that really aborts.
//
// Why this exists instead of c10d: ProcessGroupGloo in LibTorch 1.13 cannot be aborted. There is
// no group abort, Work::abort is not implemented, and after a peer is killed with kill -9 some
// survivors stay blocked inside a collective until Gloo's 30-minute timeout. Oobleck's whole
// point is to reconfigure within seconds of a failure, so the data plane must let the runtime
// tear an epoch down at once:
//   - abort() closes every socket of this transport; every pending and every later operation in
//     this process throws transport_error within milliseconds, whatever the peers are doing
//     (crashed, frozen by SIGSTOP, or still computing). Closing the sockets also makes the peers'
//     operations on those links fail, so one process aborting tears the epoch down everywhere.
//   - a peer that dies (its sockets are closed or reset by its kernel) makes the pending
//     operations that involve it fail by themselves, without abort(): a recv from it, and any
//     collective whose group contains it.
//   - there are no data timeouts. A recv may legitimately wait minutes for a slow upstream stage;
//     a frozen peer or a silently lost host is the failure detector's business, which then calls
//     abort(). Only connect() has a deadline.
// Peers: a link opens only once both ends have proved that they hold the epoch's key (the job
// token) with an HMAC over the epoch's nonce, the link's ranks and fresh challenges; the key is
// never sent (transport_handshake.hpp). A stranger who knows the epoch and the ranks can neither
// join nor take a rank from its real peer. A frame longer than config.max_frame_bytes, or of no
// known kind, aborts the transport (a broken peer) before anything is allocated for it. Traffic
// is not encrypted.
// One transport object is one epoch (one membership). After a failure, destroy or abandon it and
// build a new one for epoch e+1, on the same ports or new ones.
// Destroying a transport closes its sockets, which its peers cannot tell from a crash: their
// pending collectives over a group that contains it fail. End an epoch only once every member is
// done with it (in the cluster runtime, the coordinator's step commit is that barrier).
//
// Threading: every method except the constructor and destructor may be called from any thread
// concurrently. One background I/O thread per transport owns the sockets. send() returns without
// waiting for the receiver (it copies the bytes, or with a keep-alive takes shared ownership of
// them), so any schedule of sends and receives that would be valid with unbounded buffers cannot
// deadlock (both sides sending 64 MiB, then receiving, is fine).
//
// Data path: the I/O thread moves as much as the kernel takes per system call (non-blocking
// readv/sendmsg; Asio only waits for readiness), reads bodies straight into a receive that is
// already waiting, and acknowledges reads at once (TCP_QUICKACK: traffic in both directions
// otherwise makes Linux delay ACKs and stalls bulk senders). A send on an idle link is written
// by the calling thread itself (no hand-off); the keep-alive send() never copies, and the
// copying one copies only what the socket does not take promptly. The collectives send
// straight from the caller's buffer, pipeline each ring step in 1 MiB segments, and post their
// all-gather receives ahead so that segments land in place. An all-reduce among members of one
// machine goes through shared memory instead, with its barriers on the links
// (transport_shm.hpp, transport_config::shared_memory).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::runtime {

/// Where a rank listens: a host name or address and a TCP port (0: any free port, see
/// host_transport::listen_port).
struct peer_endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
};

/// One epoch's membership as seen by this process.
struct transport_config {
  int rank = 0;                      ///< this process's rank, an index into `peers`
  std::vector<peer_endpoint> peers;  ///< every rank's listening endpoint, indexed by rank
  std::uint64_t epoch = 0;           ///< group id; connections from another epoch are refused
  std::chrono::milliseconds connect_timeout{30'000};  ///< deadline of connect() only
  /// Large message buffers kept for reuse (fresh ones cost a page fault per 4 KiB touched).
  std::size_t buffer_cache_bytes = std::size_t{256} << 20;
  /// The secret both ends of every link prove they know in the handshake, without sending it
  /// (the job token). Empty is a key too, one everybody knows: tests and loopback benchmarks.
  std::string auth_key;
  /// Fresh per epoch (the coordinator's epoch assignment carries it): a proof made for one
  /// epoch, or one link, is worthless for another.
  std::string auth_nonce;
  /// The largest frame body a peer may send. A larger one, or a frame of no known kind, is a
  /// broken peer: the transport aborts (every pending operation fails, naming the peer) instead
  /// of allocating it. The stage sets it from the job's model (runtime::largest_frame_bytes).
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 30;
  /// All-reduces whose members all run on this machine (same boot, same network namespace,
  /// same user) sum through shared memory instead of the TCP ring: the same bits, no kernel
  /// copies. Every member of a group must agree to it, so one member with false keeps the
  /// group on the ring.
  bool shared_memory = true;
  /// The most one shared-memory step moves per member; larger data goes in pieces. Each
  /// (group, tag) holds two slots of this size (or of the data's, if smaller) in /dev/shm.
  std::size_t shared_memory_piece_bytes = std::size_t{16} << 20;
  /// A receive whose message has not arrived yet first waits this long awake, yielding its core
  /// to any other thread that can run (sched_yield), and only then sleeps. A thread that slept is
  /// woken tens of microseconds after its message arrives (a VM's wake-up), and the op it runs
  /// next starts with cold caches; a pipeline stage waits for its neighbour about twice per
  /// microbatch (bench/RESULTS.md, "A receive that waits awake"; 1 ms rather than 300 us since
  /// the receive reads its link itself while it waits, "A waiting receive reads its link
  /// itself"). 0: sleep at once.
  std::chrono::microseconds spin_wait{1000};
  /// While it waits awake, the receive reads its link's socket itself whenever the I/O thread
  /// has read everything there was: its message is taken as soon as it is in the socket, with no
  /// wake-up of the I/O thread on its way (transport_link_read.cpp, "A waiting thread reads").
  /// False: only the I/O thread reads.
  bool read_while_waiting = true;
};

/// Why an operation failed.
enum class transport_failure {
  aborted,         ///< abort() was called (or the transport is being destroyed)
  peer_lost,       ///< a peer closed or reset its connection (crash, abort, exit) or I/O failed
  connect_failed,  ///< listening or establishing the mesh failed
  mismatch,        ///< the two sides disagree about a message (size), a usage bug
};

/// The one exception type of the transport; what() names the operation, the peer and the cause,
/// e.g. "recv from peer 2 (tag 7): peer 2 closed the connection".
class transport_error : public std::runtime_error {
 public:
  /// `peer` is the rank the failure is attributed to, or -1.
  transport_error(transport_failure kind, int peer, const std::string& what);
  [[nodiscard]] transport_failure kind() const noexcept { return kind_; }
  [[nodiscard]] int peer() const noexcept { return peer_; }

 private:
  transport_failure kind_;
  int peer_;
};

/// A full TCP mesh between the ranks of one epoch. Messages are matched by (peer, tag) and
/// arrive in send order per (peer, tag). Collectives use tag spaces of their own, so their tags
/// never collide with point-to-point tags; two collectives that may run at the same time and
/// share two members need different tags, and all members must issue the collectives of a
/// given tag in the same order.
class host_transport {
 public:
  /// Binds and listens on peers[rank] (so the port is known before connect()) and starts the
  /// I/O thread. Throws transport_error(connect_failed) if the endpoint cannot be bound and
  /// std::invalid_argument if the config is inconsistent.
  explicit host_transport(transport_config config);
  /// Aborts (if not already) and joins the I/O thread. No operation may be pending.
  ~host_transport();
  host_transport(const host_transport&) = delete;
  host_transport& operator=(const host_transport&) = delete;

  /// The port actually bound (useful with port 0).
  [[nodiscard]] std::uint16_t listen_port() const;
  [[nodiscard]] int rank() const;
  [[nodiscard]] int world_size() const;
  [[nodiscard]] std::uint64_t epoch() const;

  /// Establishes the full mesh: connects to lower ranks (retrying while they are not listening
  /// yet) and accepts higher ranks. Returns when every link is up. Throws
  /// transport_error(connect_failed) naming the missing peers and the last error seen for each
  /// if that takes longer than connect_timeout; the transport is then aborted.
  void connect();
  /// Same, with the endpoints replaced (when ports were bound as 0 and exchanged afterwards).
  void connect(std::vector<peer_endpoint> peers);

  /// Blocks until the link to `peer` is up, while connect() runs (or is about to) on another
  /// thread: traffic on one link can start before the whole mesh is up. Throws as connect()
  /// does once the transport is aborted (a failed connect() aborts it), and peer_lost if the
  /// link broke.
  void wait_connected(int peer);

  /// Sends a framed message (tag, length, bytes) to `peer`; returns once `bytes` may be reused,
  /// never waiting for the receiver to call recv(). On an idle link the bytes are written from
  /// this thread while the socket takes them (the peer's I/O thread reads eagerly); what it
  /// has not taken after 1 ms + 1 ms per MB (or a rest of at most 256 KiB, at once) is copied
  /// and queued, as is the whole message when the link is busy.
  /// Throws if the transport is aborted or the link to `peer` is already broken; a failure
  /// while the message is in flight breaks the link and surfaces on later operations.
  void send(int peer, std::uint32_t tag, std::span<const std::byte> bytes);
  /// Zero-copy send: returns at once (after writing at most 256 KiB itself when the link is
  /// idle), and the bytes are written to the socket where they are, never copied. `keep_alive`
  /// owns them: the transport holds it until the bytes have been written, or dropped because
  /// the link failed or the transport was aborted or destroyed, then releases it (on the I/O
  /// thread, or on the calling thread, never under an internal lock). Until then the caller
  /// must neither modify nor free the bytes. Use it when the buffer is immutable once sent (a
  /// tensor that is only read afterwards); keep_alive may be null when the caller guarantees
  /// the lifetime by other means.
  void send(int peer, std::uint32_t tag, std::span<const std::byte> bytes,
            std::shared_ptr<const void> keep_alive);
  /// Blocks until the next message with `tag` from `peer` has been received into `out`.
  /// Throws transport_error(mismatch) (the message is consumed) if its size differs from
  /// out.size(), and peer_lost / aborted as described above. Messages that arrived completely
  /// before the peer died are still delivered.
  void recv(int peer, std::uint32_t tag, std::span<std::byte> out);

  /// A receive posted ahead of time (post_recv): its message is read straight from the socket
  /// into `out` when it arrives after the posting (not through a pooled buffer and a copy).
  /// wait() blocks until it has arrived and throws as recv() does; a receive that was not
  /// waited for is withdrawn by the destructor (which waits for a read already under way into
  /// `out`, bounded as in recv_all). Posted receives of one (peer, tag) are answered in posting
  /// order, before any recv() posted after them. The transport must outlive it.
  class posted_recv {
   public:
    ~posted_recv();
    posted_recv(const posted_recv&) = delete;
    posted_recv& operator=(const posted_recv&) = delete;
    void wait();

   private:
    friend class host_transport;
    struct impl;
    explicit posted_recv(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
  };
  /// Posts a receive of the next message with `tag` from `peer` into `out` (which must stay
  /// valid until wait() returned or the posted_recv is destroyed). Throws as recv() does when
  /// the transport is aborted or the peer already failed.
  std::unique_ptr<posted_recv> post_recv(int peer, std::uint32_t tag, std::span<std::byte> out);

  /// One receive of recv_all.
  struct recv_item {
    int peer = 0;
    std::uint32_t tag = 0;
    std::span<std::byte> out;
  };
  /// Receives every item at once: all are posted before the first is waited for, so each
  /// message that has not arrived yet is read straight from its socket into its `out` (however
  /// the messages of different peers and tags interleave), where one recv() after another would
  /// leave a message that arrives before its recv() is called to a pooled buffer and a copy.
  /// Then waits for the items in order, calling `done(i)` (if given) on this thread as item i
  /// has arrived. `posted` (if given) runs on this thread once every item is posted, before the
  /// first is waited for: the moment to tell the senders to go. Throws as recv() does, for the
  /// first item (in order) that fails, or what `done` or `posted` throws; it returns or throws
  /// only once no item is left posted or being read into. Items may be posted on links that are
  /// not up yet (while connect() runs on another thread).
  void recv_all(std::span<const recv_item> items, const std::function<void(std::size_t)>& done = {},
                const std::function<void()>& posted = {});

  /// Sums `data` element-wise over the ranks of `group` (ring order as given; every member must
  /// pass the same group and size). Ring reduce-scatter then all-gather: chunk c of the data is
  /// accumulated once, left to right, starting at group position c and going round the ring
  /// ((x_c + x_c+1) + x_c+2) + ..., and the resulting bytes are forwarded unchanged, so every
  /// member ends with bitwise identical results. Fails if any member of the group is lost.
  /// Members on one machine (transport_config::shared_memory) take the same sums through shared
  /// memory: each copies its data into a segment, the member at position c sums chunk c in the
  /// ring's order, everyone copies the sums out; frames on the links are the barriers, so a
  /// lost member or abort() fails it as it fails the ring.
  /// Large chunks travel in 1 MiB segments (the reduction of one overlaps the transfer of the
  /// next), sent straight from `data` and received straight into it: the call returns or throws
  /// only once the transport no longer touches `data`, i.e. its sends are written (or their
  /// link failed or was aborted) and no receive is left posted.
  void all_reduce_sum(std::span<const int> group, std::span<float> data, std::uint32_t tag = 0);
  /// How many all_reduce_sum calls over two or more members took each path so far.
  struct all_reduce_paths {
    std::uint64_t ring = 0;           ///< the TCP ring
    std::uint64_t shared_memory = 0;  ///< shared memory (every member on this machine)
  };
  [[nodiscard]] all_reduce_paths all_reduce_counts() const;
  /// How many read system calls that returned bytes a waiting receive made itself so far
  /// (transport_config::read_while_waiting), instead of the I/O thread.
  [[nodiscard]] std::uint64_t waiting_reads() const;
  /// Copies `data` of `root` into `data` of every other member of `group`. The root returns
  /// once the bytes are queued (copied); the others when they have arrived. Fails on a member if
  /// the root is lost.
  void broadcast(std::span<const int> group, int root, std::span<std::byte> data,
                 std::uint32_t tag = 0);

  /// Closes every socket of this transport and fails every pending and later operation with
  /// transport_error(aborted). Idempotent, callable from any thread; returns once the sockets
  /// are closed, so the listening port can be bound again immediately, and the keep-alives of
  /// zero-copy sends that will never be written are released (a send() still running on
  /// another thread releases its own as it returns).
  void abort(const std::string& reason = "aborted");
  /// True once abort() has been called (or connect() failed).
  [[nodiscard]] bool aborted() const;

 private:
  struct state;  // the implementation (transport_state.hpp), which keeps Asio out of this header
  std::unique_ptr<state> state_;
};

}  // namespace oobleck::runtime
