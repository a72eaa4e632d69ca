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

/// A worker asks to join the job.
struct register_node {
  std::uint32_t protocol_version = 0;
  std::string job_hash;  ///< hash of the job config the worker was started for; empty: any
  std::string name;      ///< host name or --name, for humans
  std::int32_t slots = 1;
  endpoint data;         ///< where this node's data plane listens
  std::string nonce;     ///< from nonce_request
  std::string proof;     ///< hex HMAC-SHA256(token, "register\n" + nonce + "\n" + name)
  /// A restarted or woken worker that was declared lost registers as a new node.
  std::int64_t previous_node = -1;

  bool operator==(const register_node&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, register_node& x) {
  return f(caf::meta::type_name("register_node"), x.protocol_version, x.job_hash, x.name, x.slots,
           x.data, x.nonce, x.proof, x.previous_node);
}

/// The coordinator's answer to an admitted node.
struct admission {
  planning::node_id node;  ///< the node id, stable for the job's life
  std::string job_toml;    ///< the job file the coordinator runs (the one source of configuration)
  std::string job_hash;

  bool operator==(const admission&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, admission& x) {
  return f(caf::meta::type_name("admission"), x.node, x.job_toml, x.job_hash);
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
