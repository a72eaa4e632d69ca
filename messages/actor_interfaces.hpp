#pragma once
// The typed interfaces of Oobleck's actors (DESIGN §5). A handle of one of these types can only be
// sent what the actor understands; the compiler checks every send and every reply.
//
//   coordinator  <- monitors (admission, epoch formation, commits), pipelines, oobleck-ctl
//   pipeline     <- coordinator (one per pipeline and epoch, in the coordinator's process)
//   monitor      <- coordinator (one per worker process: the node agent)
//   stage        <- pipeline (one per stage, detached, in the worker's process)

#include <cstdint>
#include <string>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/protocol.hpp"

namespace oobleck::messages {

using coordinator_actor = caf::typed_actor<
    // Admission: a fresh single-use nonce, then the registration that proves the token.
    caf::replies_to<nonce_request>::with<std::string>,
    caf::replies_to<register_node>::with<admission>,
    // Epoch formation and faults, from monitors.
    caf::reacts_to<epoch_aborted>, caf::reacts_to<node_ready>, caf::reacts_to<node_fault>,
    // The step protocol.
    caf::reacts_to<pipeline_done>, caf::reacts_to<step_committed>,
    // Operators and extensions.
    caf::replies_to<status_atom>::with<job_status>, caf::replies_to<inject_fault>::with<std::string>,
    caf::reacts_to<subscribe_atom, caf::actor>, caf::reacts_to<shutdown_atom, std::string>>;

using monitor_actor =
    caf::typed_actor<caf::reacts_to<abort_epoch>, caf::reacts_to<epoch_assignment>,
                     caf::reacts_to<commit_step>, caf::reacts_to<inject_fault>,
                     caf::reacts_to<shutdown_atom, std::string>>;

using pipeline_actor = caf::typed_actor<caf::reacts_to<run_step>, caf::reacts_to<stage_done>>;

using stage_actor = caf::typed_actor<caf::reacts_to<stage_step>>;

}  // namespace oobleck::messages
