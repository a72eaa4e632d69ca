#pragma once
// The typed interfaces of Oobleck's actors (ARCHITECTURE.md §5). A handle of one of these types can only be
// sent what the actor understands; the compiler checks every send and every reply.
//
//   coordinator  <- monitors (admission, epoch formation, commits), pipelines, operators
//   pipeline     <- coordinator (one per pipeline and epoch, in the coordinator's process)
//   monitor      <- coordinator (one per worker process: the node agent)
//   stage        <- monitor (forming, commit, checkpoint writes), pipeline (steps); detached, in the worker process

#include <cstdint>
#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "messages/protocol.hpp"

namespace oobleck::messages {

using coordinator_actor = caf::typed_actor<
    // Admission: a fresh single-use nonce, then the registration that proves the token.
    caf::replies_to<nonce_request>::with<std::string>,
    caf::replies_to<register_node>::with<admission>,
    // Epoch formation and the step protocol.
    caf::reacts_to<node_ready>, caf::reacts_to<epoch_aborted>, caf::reacts_to<node_fault>,
    caf::reacts_to<pipeline_done>,
    caf::reacts_to<step_committed>, caf::reacts_to<checkpoint_written>, caf::reacts_to<stall_report>,
    // Its own deadlines (delayed_send to itself).
    caf::reacts_to<coordinator_deadline>, caf::reacts_to<checkpoint_deadline>,
    // Operators: each request carries a proof of the token made with a fresh nonce.
    caf::replies_to<status_atom, control_proof>::with<job_status>,
    caf::replies_to<inject_fault, control_proof>::with<std::string>,
    caf::replies_to<subscribe_atom, caf::actor, control_proof>::with<std::string>,
    // shutdown: the reason, and whether to write a checkpoint first (oobleck-ctl shutdown --checkpoint).
    caf::replies_to<shutdown_atom, std::string, bool, control_proof>::with<std::string>,
    // A worker adopted by a coordinator of a newer term tells an older one it was replaced.
    caf::replies_to<replaced_atom, std::uint64_t, control_proof>::with<std::string>>;

using monitor_actor =
    caf::typed_actor<caf::reacts_to<epoch_assignment>, caf::reacts_to<commit_step>,
                     caf::reacts_to<abort_epoch>, caf::reacts_to<inject_fault>, caf::reacts_to<write_checkpoint>,
                     caf::reacts_to<shutdown_atom, std::string>, caf::reacts_to<stall_probe>,
                     caf::reacts_to<evict_atom, std::string>, caf::reacts_to<reconnect_atom>,
                     // Is this node still reachable, and does it still follow its coordinator (false
                     // while it looks for one after losing it)? The coordinator asks after another
                     // node's loss, and before it evicts a node that did not confirm a commit.
                     caf::replies_to<ping_atom>::with<bool>,
                     // Measure the job's model on this node: the planning profile as JSON
                     // (messages/profile_json.hpp). A job without a profile asks one node before
                     // its first plan.
                     caf::replies_to<profile_atom>::with<std::string>,
                     // From the node's own stage: it applied commit (epoch, step), which rode with
                     // the next step's orders. A nudge only: the monitor reads what was applied
                     // from the stage runtime itself.
                     caf::reacts_to<applied_atom, std::uint64_t, std::uint64_t>>;

using pipeline_actor = caf::typed_actor<caf::reacts_to<run_step>>;

/// A stage: forms its part of the epoch (data plane, executor), runs steps, applies commits.
/// Errors are values: a failed step is a stage_done with its error set.
using stage_actor =
    caf::typed_actor<caf::replies_to<epoch_assignment>::with<form_timing>,
                     caf::replies_to<stage_step>::with<stage_done>,
                     caf::replies_to<commit_step>::with<step_committed>,
                     caf::replies_to<write_checkpoint>::with<checkpoint_written>,
                     // What the node kept (layers, digests, gradients), for a replacement coordinator.
                     caf::replies_to<memory_atom>::with<node_memory>>;

}  // namespace oobleck::messages
