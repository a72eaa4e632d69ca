#pragma once
// Admission of a worker node (ARCHITECTURE.md §5): the worker proves it knows the job token without sending
// it (HMAC-SHA256 of a single-use coordinator nonce), and states its protocol version and job.
//
//   monitor                          coordinator
//     | -- nonce_request ------------>  |   issues a fresh nonce, remembers it
//     | <------------- string nonce --  |
//     | -- register_node ------------>  |   checks version, job hash, nonce, proof
//     | <----- admission | error -----  |   error: protocol_error, the job is not disturbed

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "planning/ids.hpp"

namespace oobleck::messages {

/// Where a node's data plane (host transport) listens.
struct endpoint {
  std::string host;
  std::uint16_t port = 0;

  bool operator==(const endpoint&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, endpoint& x) {
  return f(caf::meta::type_name("endpoint"), x.host, x.port);
}

/// Asks the coordinator for a nonce to prove the token against.
struct nonce_request {
  std::uint32_t protocol_version = 0;

  bool operator==(const nonce_request&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, nonce_request& x) {
  return f(caf::meta::type_name("nonce_request"), x.protocol_version);
}

/// One layer a worker holds: its parameters' digest and how many AdamW updates it has had.
struct held_layer {
  planning::layer_index layer;
  std::uint64_t digest = 0;
  std::int64_t updates = 0;

  bool operator==(const held_layer&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, held_layer& x) {
  return f(caf::meta::type_name("held_layer"), x.layer, x.digest, x.updates);
}

/// A worker's place in one epoch: its pipeline (-1: idle or only sending copies) and that
/// pipeline's nodes in stage order (node ids of the coordinator that assigned the epoch).
struct node_role {
  std::uint64_t epoch = 0;
  std::int64_t self = -1;  ///< this node's own id then
  std::int32_t pipeline = -1;
  std::vector<std::int64_t> nodes;

  bool operator==(const node_role&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_role& x) {
  return f(caf::meta::type_name("node_role"), x.epoch, x.self, x.pipeline, x.nodes);
}

/// What a worker that lost its coordinator kept of the job (ARCHITECTURE.md §10 "Coordinator
/// loss"): a replacement rebuilds the job from these. `present` is false for a fresh worker.
struct node_memory {
  bool present = false;
  std::uint64_t term = 0;            ///< the newest coordinator term that admitted it
  std::int64_t node = -1;            ///< its node id under that coordinator
  std::uint64_t epoch = 0;           ///< the newest epoch it was assigned
  std::int64_t committed_step = -1;  ///< the last commit it applied (-1: none)
  std::uint64_t committed_epoch = 0; ///< that commit's epoch
  double grad_scale = 1;             ///< that commit's clipping factor
  std::vector<node_role> roles;      ///< its place in the newest epochs it was assigned
  std::int32_t job_nodes = 0;        ///< nodes of the newest epoch it was assigned
  std::uint64_t views_epoch = 0;     ///< the epoch its stages last formed
  /// Every stage of views_epoch finished this step's gradient sum (-1: none): a commit of it can
  /// still be applied from the gradients kept.
  std::int64_t gradients_step = -1;
  std::int64_t ms_since_commit = 0;  ///< since it applied its last commit (or was admitted)
  std::vector<held_layer> layers;    ///< every layer in its store

  bool operator==(const node_memory&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_memory& x) {
  return f(caf::meta::type_name("node_memory"), x.present, x.term, x.node, x.epoch, x.committed_step,
           x.committed_epoch, x.grad_scale, x.roles, x.job_nodes, x.views_epoch, x.gradients_step,
           x.ms_since_commit, x.layers);
}

/// A worker asks to join the job.
struct register_node {
  std::uint32_t protocol_version = 0;
  std::string job_hash;  ///< hash of the job config the worker was started for; empty: any
  std::string name;      ///< host name or --name, for humans
  std::int32_t slots = 1;
  std::string device = "cpu";  ///< where its stages compute: "cpu" or "cuda" (its --device)
  endpoint data;         ///< where this node's data plane listens
  std::string nonce;     ///< from nonce_request
  std::string proof;     ///< hex HMAC-SHA256(token, "register\n" + nonce + "\n" + name)
  /// A restarted or woken worker that was declared lost registers as a new node.
  std::int64_t previous_node = -1;
  /// A worker whose coordinator went away re-registers with what it kept (a replacement adopts it).
  node_memory memory;
  /// Its GPU, the N of --device cuda:N (0 on the CPU): an NCCL job refuses a second worker on one
  /// GPU of one host.
  std::int32_t device_index = 0;

  bool operator==(const register_node&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, register_node& x) {
  return f(caf::meta::type_name("register_node"), x.protocol_version, x.job_hash, x.name, x.slots,
           x.device, x.data, x.nonce, x.proof, x.previous_node, x.memory, x.device_index);
}

/// The coordinator's answer to an admitted node.
struct admission {
  planning::node_id node;  ///< the node id, stable for the job's life
  std::string job_toml;    ///< the job file the coordinator runs (the one source of configuration)
  std::string job_hash;
  /// The coordinator's term: larger than any its nodes had seen when it adopted them.
  std::uint64_t term = 0;

  bool operator==(const admission&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, admission& x) {
  return f(caf::meta::type_name("admission"), x.node, x.job_toml, x.job_hash, x.term);
}

/// Authenticates an operator's request (oobleck-ctl, an injector actor): a nonce from
/// nonce_request and hex HMAC-SHA256(token, "control\n" + nonce).
struct control_proof {
  std::string nonce;
  std::string proof;

  bool operator==(const control_proof&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_proof& x) {
  return f(caf::meta::type_name("control_proof"), x.nonce, x.proof);
}

}  // namespace oobleck::messages
