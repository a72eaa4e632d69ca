#pragma once
// A rank's part of a new epoch's layer copies: the full state of each layer the epoch's copy plan
// moves (parameters, AdamW moments, step count) goes from a rank that holds it to a rank that
// will run it, over the epoch's host transport, each link as soon as it is up. Data-plane work
// only (threads, tags, condition variables): the stage actor runs it while the epoch's mesh
// connects and reports its timing to the coordinator; tests and benchmarks run it on ranks that
// are threads.

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/gpt_config.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::runtime {

class communicator;
class host_transport;
class host_communicator;

/// One entry of an epoch's copy plan: the full state of `layer` goes from rank `source` to rank
/// `target` (the epoch's ranks, as the coordinator's epoch assignment names them).
struct copy_entry {
  std::int32_t layer = 0;
  std::int32_t source = 0;
  std::int32_t target = 0;
};

/// What a rank's copies took (microseconds of the rank's steady clock) and moved.
/// copies_us: the time during which some link of the rank was copying (from its ready to the
/// source's last message arrived, or to the rank's sends to that target posted), plus installing
/// the received layers; copy_wait_us: the longest wait, over its sources, from its ready to the
/// source's first message (the senders' skew), 0 when it receives nothing.
struct copy_timing {
  std::int64_t copies_us = 0;
  std::int64_t copy_wait_us = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
};

/// A rank's part of an epoch's copy plan.
///
/// The constructor allocates and pre-faults the buffers of the layers this rank receives
/// (layer_store::prepare_incoming), in plan order, before the rank's links come up: a copy then
/// starts as soon as its link is up, and no page is faulted in during the transfer on the
/// transport's I/O thread.
///
/// run() copies, while the epoch's mesh connects (on another thread): each layer's full state as
/// a checksummed header, then the store's three flat buffers as they are, received straight into
/// the new layer's buffers (no serialisation, no intermediate copy, no initialisation drawn only to
/// be overwritten). A receiving rank first posts every receive at once, so each message is read
/// from its socket straight into its buffer whatever the order in which the messages arrive. Then
/// each link is used as soon as it is up, whatever the rest of the mesh does: the rank tells a
/// source on it that it is ready, before sending any layer of its own on that link, and sends a
/// target its layers once the target is ready; the links to different peers run together, one
/// thread each. The layers are installed when all have arrived. The transport checks every
/// message's length; the replicas' digests are compared after every commit. The first failure
/// aborts the transport (so the other links fail at once) and is rethrown. No byte of a copy
/// travels outside its link's span, and time spent waiting for a link to come up is the mesh's,
/// not the copies'. run() first checks the plan against the store (std::logic_error): a layer
/// sent from this rank must be held here, and a rank that runs no stage (`runs_stages` false)
/// receives nothing.
///
/// Every wait of run() has a deadline (time_limit): a peer that does not send its layers, or
/// does not take this rank's, in time is presumed lost. run() then aborts the transport and
/// throws transport_error(peer_lost) naming the late peers, as it would for a peer that died.
class layer_copies {
 public:
  layer_copies(layer_store& store, std::int32_t rank, bool runs_stages, std::vector<copy_entry> plan);

  /// Bytes of layer state this rank's part of the plan receives and sends.
  [[nodiscard]] std::int64_t bytes() const;
  /// How long run() may take: `connect_timeout` (the mesh's, during which a peer may not be
  /// there yet) plus bytes() at copy_floor_bytes_per_second.
  [[nodiscard]] std::chrono::milliseconds time_limit(std::chrono::milliseconds connect_timeout) const;

  /// Runs this rank's part of the plan (once) and installs what it received; throws once
  /// `limit` has passed since the call (see above).
  copy_timing run(host_transport& transport, host_communicator& comm, std::chrono::milliseconds limit);
  /// run() with time_limit(30 s).
  copy_timing run(host_transport& transport, host_communicator& comm);
  /// Runs this rank's part of the plan over a data plane whose links all exist once it is ready
  /// and whose sends are queued, returning at once (NCCL's, runtime/nccl_communicator.hpp): every
  /// layer this rank sends is queued first (header, then the three flat buffers, to each target
  /// in plan order), then each incoming layer is received in plan order straight into its
  /// buffers, and the layers are installed when all have arrived. A link delivers in send order
  /// and both sides follow the plan, so no ready message is needed, and no rank waits for a
  /// receive before its own sends are queued, so no two ranks wait for each other. The header
  /// travels on the buffers' device. There is no deadline of its own: every wait is the
  /// communicator's, which abort() from another thread (the stage's, on the coordinator's
  /// forming deadline) fails at once. A failure aborts `comm` (the epoch is over) and is
  /// rethrown; nothing is installed then. The plan is checked as run() checks it.
  copy_timing run(communicator& comm);

 private:
  layer_store& store_;
  std::int32_t rank_;
  bool runs_stages_;
  std::vector<copy_entry> plan_;
  std::vector<layer_store::incoming> incoming_;  ///< the received layers' buffers, in plan order
};

/// The bandwidth below which a copy is presumed stuck: far below any link a job runs on (a
/// 1 Gb/s link moves 125 MB/s), so that a slow but live peer is never taken for a lost one.
inline constexpr double copy_floor_bytes_per_second = 10e6;

/// The largest frame an epoch of `model` trained with microbatches of `microbatch` samples puts
/// on the data plane (host_transport's transport_config::max_frame_bytes): a layer's state
/// buffer in a copy, an activation or its gradient, an all-reduce segment, with a margin of two.
std::uint64_t largest_frame_bytes(const gpt_config& model, std::int64_t microbatch);

/// Microseconds from `since` to now (the unit of copy_timing, and of the stage's form timing).
std::int64_t micros_since(std::chrono::steady_clock::time_point since);

/// Microseconds covered by the union of the spans [from, to) (empty or reversed spans count
/// nothing): the time during which at least one of them was under way.
std::int64_t covered_micros(
    std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> spans);

}  // namespace oobleck::runtime
