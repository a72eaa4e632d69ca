#pragma once
// Forming an epoch (ARCHITECTURE.md §5 "Reconfiguration"): the coordinator sends every node in the job its
// part of the epoch mapping and the copy plan; nodes abort the old data plane, form the new one,
// copy the layers they lack and report ready with the handles of their stage actors.
//
//   coordinator                      monitor (every node)
//     | -- abort_epoch{e} ---------->  |   aborts the data plane, discards the uncommitted step
//     | <------------ epoch_aborted -- |
//     | -- epoch_assignment{e+1} ---->  |   new transport, copies, stage views
//     | <-------------- node_ready ---  |   (or node_fault)

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/meta/type_name.hpp>

#include "messages/admission_messages.hpp"
#include "planning/ids.hpp"

namespace oobleck::messages {

/// One stage a node runs in an epoch (ranks are the epoch's; planning::no_rank: none).
struct stage_assignment {
  std::int32_t pipeline = 0;
  std::int32_t stage = 0;
  std::int32_t num_stages = 1;
  planning::layer_index first_layer;
  planning::layer_index end_layer;  ///< layers [first_layer, end_layer)
  planning::rank prev_rank = planning::no_rank;
  planning::rank next_rank = planning::no_rank;
  /// d: the node's slots the stage runs on (a power of two; the widths of a node's stages add up
  /// to its slots). On CPU, its LibTorch intra-op threads.
  std::int32_t width = 1;
  /// Ranks of the pipeline's first and last stage (the embedding group of a tied-embedding model).
  planning::rank first_rank = planning::no_rank;
  planning::rank last_rank = planning::no_rank;

  bool operator==(const stage_assignment&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_assignment& x) {
  return f(caf::meta::type_name("stage_assignment"), x.pipeline, x.stage, x.num_stages, x.first_layer,
           x.end_layer, x.prev_rank, x.next_rank, x.width, x.first_rank, x.last_rank);
}

/// One entry of an epoch's copy plan, in the epoch's ranks (planning::epoch_copy on the wire; the
/// same copy by node id is planning::layer_copy): the full state of `layer` goes from rank `source`
/// to rank `target`.
struct epoch_copy {
  planning::layer_index layer;
  planning::rank source;
  planning::rank target;

  bool operator==(const epoch_copy&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, epoch_copy& x) {
  return f(caf::meta::type_name("epoch_copy"), x.layer, x.source, x.target);
}

/// A directed point-to-point link of the epoch's data plane (planning::rank_link on the wire):
/// messages go from rank `from` to rank `to`.
struct p2p_link {
  planning::rank from;
  planning::rank to;

  bool operator==(const p2p_link&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, p2p_link& x) {
  return f(caf::meta::type_name("p2p_link"), x.from, x.to);
}

/// What one node does in epoch `epoch`.
struct epoch_assignment {
  std::uint64_t epoch = 0;
  std::uint64_t next_step = 0;          ///< the step the epoch starts with (re-run if uncommitted)
  planning::rank rank = planning::no_rank;  ///< this node's rank; no_rank: idle in this epoch
  std::vector<endpoint> peers;          ///< data-plane endpoint of every rank
  std::vector<stage_assignment> stages; ///< this node's stages in pipeline order (empty when idle)
  std::vector<std::vector<planning::rank>> layer_groups;  ///< per layer: ranks of all its holders
  std::vector<epoch_copy> copies;       ///< the whole copy plan (each node runs its part)
  std::vector<std::int32_t> pipeline_microbatches;  ///< batch distribution, per pipeline
  /// The job's first epoch of a resumed job: the checkpoint directory its layers come from
  /// (validated by the coordinator); empty: layers are built from their seed (or kept, copied).
  std::string resume_dir;
  /// Fresh random bytes (hex) per epoch: the data plane's handshake proves the job token over
  /// them, so a handshake recorded in one epoch proves nothing in another.
  std::string data_nonce;
  /// The coordinator's term (a worker refuses an assignment of a lower term than it has seen) and
  /// the number of nodes the epoch assigns (a replacement coordinator waits for that many).
  std::uint64_t term = 0;
  std::int32_t job_nodes = 0;
  std::vector<std::int64_t> rank_nodes;  ///< the node id of every rank
  /// The NCCL data plane ([cluster] data_plane = "nccl"): the epoch's ncclUniqueId (its 128 bytes,
  /// drawn by the coordinator, the same for every rank) and every link its messages travel on
  /// (planning::p2p_links, the same list for every rank). Empty: the host transport.
  std::vector<std::uint8_t> nccl_id;
  std::vector<p2p_link> p2p_links;

  bool operator==(const epoch_assignment&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, epoch_assignment& x) {
  return f(caf::meta::type_name("epoch_assignment"), x.epoch, x.next_step, x.rank, x.peers, x.stages,
           x.layer_groups, x.copies, x.pipeline_microbatches, x.resume_dir, x.data_nonce, x.term, x.job_nodes,
           x.rank_nodes, x.nccl_id, x.p2p_links);
}

/// Where a node's forming time went (microseconds, in the node's clock), and the copy plan's bytes
/// it moved: connect = the epoch's data-plane mesh; copies = its part of the copy plan, which
/// runs on each link as soon as the link is up, while the rest of the mesh may still be forming:
/// the time during which some link of the node was copying (from the receiver's ready, before
/// which its source sends nothing, to the source's last message arrived, or to the source's
/// sends posted), plus installing the received layers; prepare = allocating and pre-faulting
/// the buffers of the layers it receives, before its links come up; copy_wait = the longest
/// wait, over its sources, from its ready to the source's first message (the senders' skew), 0
/// when it receives nothing.
struct form_timing {
  std::int64_t connect_us = 0;
  std::int64_t copies_us = 0;
  std::int64_t views_us = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  std::int64_t prepare_us = 0;
  std::int64_t copy_wait_us = 0;

  bool operator==(const form_timing&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, form_timing& x) {
  return f(caf::meta::type_name("form_timing"), x.connect_us, x.copies_us, x.views_us, x.bytes_sent,
           x.bytes_received, x.prepare_us, x.copy_wait_us);
}

/// A node formed its part of the epoch: stage actor handles in the order of its assignment.
struct node_ready {
  std::uint64_t epoch = 0;
  planning::node_id node;
  std::vector<caf::actor> stages;
  form_timing timing;

  bool operator==(const node_ready&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_ready& x) {
  return f(caf::meta::type_name("node_ready"), x.epoch, x.node, x.stages, x.timing);
}

/// Tear epoch `epoch` down: fail every pending data-plane operation, drop the uncommitted step.
struct abort_epoch {
  std::uint64_t epoch = 0;
  std::string reason;

  bool operator==(const abort_epoch&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_epoch& x) {
  return f(caf::meta::type_name("abort_epoch"), x.epoch, x.reason);
}

struct epoch_aborted {
  std::uint64_t epoch = 0;
  planning::node_id node;

  bool operator==(const epoch_aborted&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, epoch_aborted& x) {
  return f(caf::meta::type_name("epoch_aborted"), x.epoch, x.node);
}

/// Something failed on a node outside the protocol's happy path (stage exception, collective
/// error, copy failure); the coordinator reacts as to a loss of the epoch, not of the node.
struct node_fault {
  std::uint64_t epoch = 0;
  planning::node_id node;
  std::string what;
  /// The node's own stage failed (an exception in its compute, commit, copy or checkpoint: out
  /// of memory, a c10::Error), not its data plane: the failure is this node's, and counts
  /// towards its eviction. False: it saw the epoch fail (a peer, an abort).
  bool own = false;
  /// Own, and it failed applying a commit: its layers may be neither the old state nor the new, so
  /// the node is evicted at once. False for a step's failure, which is a strike; a step whose
  /// orders rode with the commit (run-ahead) may fail while the coordinator still collects the
  /// commit's acknowledgements, and must not be taken for the commit's.
  bool in_commit = false;

  bool operator==(const node_fault&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_fault& x) {
  return f(caf::meta::type_name("node_fault"), x.epoch, x.node, x.what, x.own, x.in_commit);
}

/// The coordinator asks a node, after a deadline passed, what its stages are doing; the node's
/// monitor answers from its own thread (a stage stuck in compute cannot answer itself).
struct stall_probe {
  std::uint64_t epoch = 0;
  std::uint64_t probe = 0;  ///< the coordinator's number for this round of probes

  bool operator==(const stall_probe&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stall_probe& x) {
  return f(caf::meta::type_name("stall_probe"), x.epoch, x.probe);
}

/// What a node's stages are doing (stall_probe's answer). A stage that has been computing for
/// long while its peers wait for it is the culprit of a step that does not finish; a node that has
/// not started forming the epoch (its previous step still holds its stages) is the culprit of an
/// epoch that does not form.
struct stall_report {
  std::uint64_t probe = 0;
  planning::node_id node;
  std::uint64_t epoch = 0;         ///< the newest epoch the node's stages started forming
  bool formed = false;             ///< that epoch formed on the node
  bool forming_blocked = false;    ///< forming waits for a step of the node that does not end
  wire_double computing_ms = 0;    ///< the longest time a stage of the node has been computing now (0: none)
  wire_double waiting_ms = 0;      ///< the longest time a stage has been waiting for its peers now

  bool operator==(const stall_report&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stall_report& x) {
  return f(caf::meta::type_name("stall_report"), x.probe, x.node, x.epoch, x.formed, x.forming_blocked,
           x.computing_ms, x.waiting_ms);
}

/// A deadline the coordinator set itself (delayed_send to itself; from anyone else it is dropped).
enum class deadline_kind : std::uint8_t {
  step,    ///< the step did not finish in time
  form,    ///< the epoch did not form in time
  commit,  ///< the commit was not confirmed in time
  probe,   ///< the nodes had their time to answer the stall probe
  adopt,   ///< a replacement coordinator waited long enough for the nodes of the job it adopts
  losses,  ///< the node losses that arrived together are handled (every node lost at once: wait for them)
  wait,    ///< a job below its minimum waited --wait-for-nodes for nodes: it stops
};

struct coordinator_deadline {
  deadline_kind kind = deadline_kind::step;
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::uint64_t probe = 0;

  bool operator==(const coordinator_deadline&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, coordinator_deadline& x) {
  return f(caf::meta::type_name("coordinator_deadline"), x.kind, x.epoch, x.step, x.probe);
}

}  // namespace oobleck::messages
