#pragma once
// The coordinator's gate (ARCHITECTURE.md §5 "Who may speak"). Every node-side message passes it
// before any phase sees it: it must come from the actor the coordinator admitted for the node it
// names (that node's monitor, by sender identity, never by the id in the message) or spawned for
// the pipeline it names, and every index and size in it must fit what the job and the epoch in
// force allow. A message that fails is refused: dropped, counted (dropped and refused_messages)
// and logged with its sender, at most once per power of ten per sender, so a flood cannot fill the
// disk. The gate holds against a peer that speaks CAF's protocol the way CAF's library does
// (remote_actor, send, request); see README.md "Security" for what CAF 0.17 lets a peer that
// writes its own protocol frames do.

//
// Private to actors/ (coordinator.cpp dispatches through it).

#include <string>
#include <type_traits>

#include <caf/actor_addr.hpp>
#include <caf/actor_control_block.hpp>

#include "actors/coordinator.hpp"

namespace oobleck::actors {

/// The gate's answer.
struct gate_verdict {
  enum kind_t : std::uint8_t {
    accept,  ///< the phase decides
    fence,   ///< from a lost node, or of another epoch where the sender cannot be told: dropped
    refuse,  ///< forged or malformed: dropped, counted as refused, logged
  } kind = accept;
  std::string why;  ///< refuse: what is wrong
};

/// Whether `sender` is the actor `who`.
bool sent_by(const caf::strong_actor_ptr& sender, const caf::actor_addr& who);

/// The gate of each node-side message (and of the coordinator's own deadlines). It may shorten a
/// message's free text (an error, a fault) to a bounded length.
gate_verdict gate(coordinator_pointer self, messages::node_ready& m);
gate_verdict gate(coordinator_pointer self, messages::node_fault& m);
gate_verdict gate(coordinator_pointer self, messages::epoch_aborted& m);
gate_verdict gate(coordinator_pointer self, messages::stall_report& m);
gate_verdict gate(coordinator_pointer self, messages::step_committed& m);
gate_verdict gate(coordinator_pointer self, messages::checkpoint_written& m);
gate_verdict gate(coordinator_pointer self, messages::pipeline_done& m);
gate_verdict gate(coordinator_pointer self, messages::coordinator_deadline& m);
/// The coordinator's own timers: accepted from itself only.
gate_verdict from_self(coordinator_pointer self);

inline const char* message_name(const messages::node_ready&) { return "node_ready"; }
inline const char* message_name(const messages::node_fault&) { return "node_fault"; }
inline const char* message_name(const messages::epoch_aborted&) { return "epoch_aborted"; }
inline const char* message_name(const messages::stall_report&) { return "stall_report"; }
inline const char* message_name(const messages::step_committed&) { return "step_committed"; }
inline const char* message_name(const messages::checkpoint_written&) { return "checkpoint_written"; }
inline const char* message_name(const messages::pipeline_done&) { return "pipeline_done"; }
inline const char* message_name(const messages::coordinator_deadline&) { return "coordinator_deadline"; }

/// Drops and counts a refused message (dropped and refused_messages); logs it with its sender at
/// that sender's 1st, 10th, 100th... refusal (at most refusal_senders_named senders by name).
void refuse_message(coordinator_pointer self, const char* what, const std::string& why);

/// An exception out of a handler: valid input never causes one (the gate checked it), so it is the
/// coordinator's bug: logged with BUG and the sender, reported through on_bug, and the job goes on.
void handler_threw(coordinator_pointer self, const char* what, const char* error);

/// Runs `f`; an exception it throws is handler_threw's, and a request gets an error reply.
template <class F>
auto guarded(coordinator_pointer self, const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    handler_threw(self, what, e.what());
  } catch (...) {
    handler_threw(self, what, "an exception of unknown type");
  }
  if constexpr (std::is_same_v<decltype(f()), bool>)
    return false;
  else if constexpr (!std::is_void_v<decltype(f())>)
    return messages::make_error(messages::protocol_error::bad_request, std::string("the coordinator failed to handle ") + what);
}

/// Forgets the oldest lost nodes beyond lost_entries_kept that the job no longer refers to.
void forget_old_losses(coordinator_state& st);

/// Who asked for a nonce, for the nonce book's bound per asker: a remote process (every actor
/// behind one connection is one asker), or a local actor.
std::string nonce_owner(coordinator_pointer self);

}  // namespace oobleck::actors
