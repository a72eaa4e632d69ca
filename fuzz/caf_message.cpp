// CAF message payloads: what the middleman decodes from the bytes a peer sends to the
// coordinator's or a worker's port, with the protocol's types registered. Every input must end
// decoded or with CAF's error; a decoded message must serialize again and decode to the same.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deep_to_string.hpp>
#include <caf/message.hpp>

#include "messages/protocol.hpp"

namespace {

struct config : caf::actor_system_config {
  config() {
    oobleck::messages::add_protocol_types(*this);
    set("scheduler.max-threads", 1);
    set("logger.verbosity", caf::atom("quiet"));
  }
};

/// Never destroyed: tearing an actor system down in exit handlers, after CAF's own statics, crashes
/// in CAF (seen as a "finding" on the empty input at the end of a run).
caf::actor_system& system_() {
  static auto* cfg = new config;
  static auto* sys = new caf::actor_system{*cfg};
  return *sys;
}

/// True when every element is one of the protocol's own types: only those are re-encoded. CAF's
/// built-in float types would hang the re-encode (pack754 never returns on a NaN or an infinity,
/// CAF 0.17.6); the protocol carries its doubles as bits (messages/wire_double.hpp), and Oobleck's
/// actors never send a message they received from outside on.
template <class... Ts>
bool all_ours(const caf::message& m) {
  for (std::size_t i = 0; i < m.size(); ++i)
    if (!(m.match_element<Ts>(i) || ...)) return false;
  return true;
}

bool protocol_only(const caf::message& m) {
  using namespace oobleck::messages;
  return all_ours<endpoint, nonce_request, register_node, admission, control_proof, stage_assignment, epoch_copy,
                  epoch_assignment, node_ready, abort_epoch, epoch_aborted, node_fault, run_step, stage_step,
                  stage_timing, stage_done, pipeline_done, commit_step, layer_digest, step_committed, inject_fault,
                  node_status, pipeline_status, job_status, job_event, write_checkpoint, checkpoint_layer_file,
                  checkpoint_written, std::string, std::uint64_t, std::int64_t, caf::actor>(m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto& sys = system_();
  caf::message msg;
  caf::binary_deserializer source{sys, reinterpret_cast<const char*>(data), size};
  if (source(msg)) return 0;  // refused: CAF's error
  if (!protocol_only(msg)) return 0;
  std::vector<char> again;
  caf::binary_serializer sink{sys, again};
  if (sink(msg)) std::abort();  // decoded but cannot be encoded again
  caf::message back;
  caf::binary_deserializer reread{sys, again};
  if (reread(back)) std::abort();
  if (caf::to_string(back) != caf::to_string(msg)) std::abort();
  return 0;
}
