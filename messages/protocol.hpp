#pragma once
// The protocol between Oobleck's actors: its version, its error codes, and the one CAF type-ID
// block that names every message type (the same names on every node). Every main and every test
// fixture calls add_protocol_types(cfg) before building its actor_system.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/type_id.hpp>

#include "messages/admission_messages.hpp"
#include "messages/checkpoint_messages.hpp"
#include "messages/control_messages.hpp"
#include "messages/epoch_messages.hpp"
#include "messages/step_messages.hpp"

namespace oobleck::messages {

/// Bumped on every incompatible change of a message; nodes of another version are refused.
constexpr std::uint32_t protocol_version = 17;  // 2: form timings in node_ready; 3: checkpoints (write_checkpoint, resume_dir); 4: step timings (stage_timing); 5: slots (stage widths, wrong_slots); 6: copy preparation and wait in form_timing; 7: typed job events (epoch_forming, commit_stood, step_failed, checkpoint_written, node_refused; stop outcome); 8: typed ids (node_id, rank, layer_index) in the node-side messages, epoch_copy; 9: hostile and faulty conditions (stage faults: error and stall kinds, own failures, stall probes, deadlines, eviction; authenticated data plane; checkpoint writers replaced); 10: a real model (tied-embedding group ranks, gradient clipping's norm and scale, evaluation rounds, tied digests) and each stage's op times (the step's ideal makespan); 11: replaceable coordinator (node_memory in register_node, terms in admission and epoch_assignment, the stage's memory request); 12: waiting below the minimum (waiting_for_nodes and resumed events, nodes_needed in the status, the wait deadline); 13: digests only where checked (commit_step.digests); 14: profile at job start (profile_atom to a monitor, the profile as JSON back); 15: the device kind in register_node (wrong_device); 16: orders that ride with the commit (run_step and stage_step commit_first, commit_step with_run); 17: the NCCL data plane (epoch_assignment nccl_id and p2p_links, register_node device_index); node_fault in_commit

/// Expected failures returned as values (caf::error with category "oobleck").
enum class protocol_error : std::uint8_t {
  bad_proof = 1,       ///< the worker does not know the job token (or reused a nonce)
  wrong_version,       ///< another protocol version
  wrong_job,           ///< the worker was started for another job config
  not_registering,     ///< the job does not admit this node now
  unknown_node,        ///< a node id the coordinator never admitted, or declared lost
  stale_epoch,         ///< a message of another epoch
  bad_request,         ///< a malformed request (out-of-range ids, inconsistent fields)
  wrong_slots,         ///< the worker's --slots differs from the job's cluster.slots_per_node
  evicted,             ///< the coordinator evicted this node (its stages failed or stalled repeatedly)
  superseded,          ///< a newer coordinator (a higher term) adopted the job
  wrong_device,        ///< the worker's --device kind differs from the job's cluster.device
};

caf::error make_error(protocol_error x);
/// With a sentence for the human on the other side (carried in the error's context).
caf::error make_error(protocol_error x, std::string context);
std::string to_string(protocol_error x);
std::string to_string(fault_kind x);
std::string to_string(event_kind x);
std::string to_string(stop_outcome x);
/// True for errors made by make_error above (category "oobleck").
bool is_protocol_error(const caf::error& e);
/// "bad_proof: <context>" for ours, CAF's own rendering for the others.
std::string describe(const caf::error& e);
/// Registers every message type of the protocol and the error category. Every main and every
/// test fixture calls it on its config before building the actor_system.
void add_protocol_types(caf::actor_system_config& cfg);

}  // namespace oobleck::messages

CAF_BEGIN_TYPE_ID_BLOCK(oobleck, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::endpoint))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::nonce_request))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::register_node))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::held_layer))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::node_role))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::node_memory))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::admission))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::control_proof))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stage_assignment))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::epoch_copy))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::epoch_assignment))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::node_ready))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::form_timing))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::abort_epoch))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::epoch_aborted))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::node_fault))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::run_step))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stage_step))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stage_timing))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stage_done))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::pipeline_done))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::commit_step))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::layer_digest))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::step_committed))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::inject_fault))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::node_status))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::pipeline_status))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::job_status))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::job_event))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::write_checkpoint))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::checkpoint_layer_file))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::checkpoint_written))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::checkpoint_deadline))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stall_probe))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::stall_report))
  CAF_ADD_TYPE_ID(oobleck, (oobleck::messages::coordinator_deadline))
  CAF_ADD_ATOM(oobleck, oobleck::messages, status_atom, "status")
  CAF_ADD_ATOM(oobleck, oobleck::messages, subscribe_atom, "subscribe")
  CAF_ADD_ATOM(oobleck, oobleck::messages, shutdown_atom, "shutdown")
  CAF_ADD_ATOM(oobleck, oobleck::messages, evict_atom, "evict")
  CAF_ADD_ATOM(oobleck, oobleck::messages, memory_atom, "memory")
  CAF_ADD_ATOM(oobleck, oobleck::messages, reconnect_atom, "reconnect")
  CAF_ADD_ATOM(oobleck, oobleck::messages, replaced_atom, "replaced")
  CAF_ADD_ATOM(oobleck, oobleck::messages, ping_atom, "ping")
  CAF_ADD_ATOM(oobleck, oobleck::messages, profile_atom, "profile")
  CAF_ADD_ATOM(oobleck, oobleck::messages, applied_atom, "applied")
CAF_END_TYPE_ID_BLOCK(oobleck)
