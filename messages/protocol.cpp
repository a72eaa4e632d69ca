#include "messages/protocol.hpp"

#include <caf/atom.hpp>

namespace oobleck::messages {

namespace {
constexpr caf::atom_value error_category = caf::atom("oobleck");
}  // namespace

caf::error make_error(protocol_error x) {
  return {static_cast<std::uint8_t>(x), error_category};
}

caf::error make_error(protocol_error x, std::string context) {
  return {static_cast<std::uint8_t>(x), error_category, caf::make_message(std::move(context))};
}

std::string to_string(protocol_error x) {
  switch (x) {
    case protocol_error::bad_proof: return "bad_proof";
    case protocol_error::wrong_version: return "wrong_version";
    case protocol_error::wrong_job: return "wrong_job";
    case protocol_error::not_registering: return "not_registering";
    case protocol_error::unknown_node: return "unknown_node";
    case protocol_error::stale_epoch: return "stale_epoch";
    case protocol_error::bad_request: return "bad_request";
    case protocol_error::wrong_slots: return "wrong_slots";
    case protocol_error::wrong_device: return "wrong_device";
    case protocol_error::evicted: return "evicted";
    case protocol_error::superseded: return "superseded";
  }
  return "protocol_error(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(fault_kind x) {
  switch (x) {
    case fault_kind::kill: return "kill";
    case fault_kind::hang: return "hang";
    case fault_kind::error: return "error";
    case fault_kind::stall: return "stall";
  }
  return "fault_kind(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(event_kind x) {
  switch (x) {
    case event_kind::node_joined: return "node_joined";
    case event_kind::node_lost: return "node_lost";
    case event_kind::epoch_formed: return "epoch_formed";
    case event_kind::step_committed: return "step_committed";
    case event_kind::stopped: return "stopped";
    case event_kind::epoch_forming: return "epoch_forming";
    case event_kind::commit_stood: return "commit_stood";
    case event_kind::step_failed: return "step_failed";
    case event_kind::checkpoint_written: return "checkpoint_written";
    case event_kind::node_refused: return "node_refused";
    case event_kind::waiting_for_nodes: return "waiting_for_nodes";
    case event_kind::resumed: return "resumed";
  }
  return "event_kind(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(stop_outcome x) {
  switch (x) {
    case stop_outcome::none: return "none";
    case stop_outcome::finished: return "finished";
    case stop_outcome::shutdown: return "shutdown";
    case stop_outcome::failed: return "failed";
    case stop_outcome::checkpoint_and_stop: return "checkpoint_and_stop";
    case stop_outcome::superseded: return "superseded";
  }
  return "stop_outcome(" + std::to_string(static_cast<int>(x)) + ")";
}

bool is_protocol_error(const caf::error& e) { return e && e.category() == error_category; }

std::string describe(const caf::error& e) {
  if (!e) return "no error";
  if (e.category() != error_category) return caf::to_string(e);
  std::string out = to_string(static_cast<protocol_error>(e.code()));
  if (!e.context().empty() && e.context().match_elements<std::string>())
    out += ": " + e.context().get_as<std::string>(0);
  return out;
}

void add_protocol_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::oobleck>();
  // (The templated add_error_category of 0.17.6 does not compile: its lambda has the wrong
  // signature. This is the renderer it meant.)
  cfg.add_error_category(error_category,
                         [](std::uint8_t code, caf::atom_value, const caf::message& context) {
                           std::string out = "oobleck: " + to_string(static_cast<protocol_error>(code));
                           if (context.match_elements<std::string>())
                             out += " (" + context.get_as<std::string>(0) + ")";
                           return out;
                         });
}

}  // namespace oobleck::messages
