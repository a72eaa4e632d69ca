#pragma once
// The typed interfaces of Oobleck's actors (DESIGN §5). A handle of one of these types can only be
// sent what the actor understands; the compiler checks every send and every reply. Each interface
// lists what its actor implements today; the epoch and step messages (epoch_messages.hpp,
// step_messages.hpp) join the coordinator's and the monitor's interfaces with the training path.
//
//   coordinator  <- monitors (admission), operators (oobleck-ctl, injector actors)
//   monitor      <- coordinator (one per worker process: the node agent)

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
    // Operators: each request carries a proof of the token made with a fresh nonce.
    caf::replies_to<status_atom, control_proof>::with<job_status>,
    caf::replies_to<inject_fault, control_proof>::with<std::string>,
    caf::replies_to<subscribe_atom, caf::actor, control_proof>::with<std::string>,
    caf::replies_to<shutdown_atom, std::string, control_proof>::with<std::string>>;

using monitor_actor =
    caf::typed_actor<caf::reacts_to<inject_fault>, caf::reacts_to<shutdown_atom, std::string>>;

}  // namespace oobleck::messages
