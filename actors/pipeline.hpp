#pragma once
// The pipeline actor (ARCHITECTURE.md §5): one per pipeline and epoch, in the coordinator's process. It
// drives one pipeline's step: tells each of its stages which microbatches of the global batch are
// theirs, collects their completions and reports the pipeline's to the coordinator. Responses of
// another epoch or step are dropped and counted (fencing). It takes run_step from its coordinator
// only, and a stage's answer from that stage only: CAF 0.17 matches a response to its request by
// the request's id alone, and ids are a per-actor counter, so an answer from any other actor with
// that id is refused (counted) and the wait for the real one goes on. An error without a sender is
// the runtime's own (the stage or its connection is gone) and is taken.
//
//   idle --run_step{e,k}--> stepping --(every stage done | one failed)--> idle

#include <cstdint>
#include <vector>

#include <caf/stateful_actor.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::actors {

struct pipeline_deps {
  std::uint64_t epoch = 0;
  std::int32_t index = 0;  ///< the pipeline's position in the epoch
  std::vector<messages::stage_actor> stages;  ///< in stage order
  std::int32_t first_microbatch = 0;  ///< of the global batch: the pipeline's contiguous slice
  std::int32_t microbatches = 0;
  messages::coordinator_actor coordinator;
};

struct pipeline_state {
  pipeline_deps deps;
  std::uint64_t step = 0;
  bool running = false;
  std::size_t pending = 0;
  double loss_sum = 0;
  std::string error;
  messages::stage_timing slowest;  ///< of the step's stages, the one busy longest
  bool eval = false;               ///< the round running is an evaluation
  std::vector<double> grad_sq;     ///< per stage, added in stage order when all answered
  /// Per stage: its forward and backward op times of every microbatch (the step's ideal makespan).
  std::vector<std::vector<double>> forward_ms, backward_ms;
  double allreduce_ms = 0;  ///< the longest all-reduce wait of the step's stages
  std::uint64_t dropped = 0;
  std::uint64_t refused = 0;  ///< run_step not from the coordinator, answers not from the stage asked
  static inline const char* name = "oobleck.pipeline";
};

using pipeline_pointer = messages::pipeline_actor::stateful_pointer<pipeline_state>;

messages::pipeline_actor::behavior_type pipeline(pipeline_pointer self, pipeline_deps deps);

}  // namespace oobleck::actors
