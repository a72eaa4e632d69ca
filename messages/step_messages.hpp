#pragma once
// One transactional step (ARCHITECTURE.md §5 "Step protocol"): every message carries (epoch, step), and a
// receiver drops (and counts) anything from another epoch or step.
//
//   coordinator        pipeline (per pipeline)        stage (per stage)        monitor (per node)
//     | -- run_step -->  | -- stage_step ----------->  | 1F1B, gradient all-reduce
//     |                  | <----------- stage_done --  |
//     | <- pipeline_done |
//     | -- commit_step (after every pipeline) ---------------------------------->  | AdamW on its layers
//     | <---------------------------------------------------------- step_committed |  digests per layer

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "messages/wire_double.hpp"
#include "planning/ids.hpp"

namespace oobleck::messages {

/// Coordinator -> pipeline actor: run step `step` of epoch `epoch`.
struct run_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;

  bool operator==(const run_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_step& x) {
  return f(caf::meta::type_name("run_step"), x.epoch, x.step);
}

/// Where a stage's step went, in milliseconds of its own steady clock (runtime::step_timing plus
/// busy_ms: from receiving stage_step to replying, so the rest of the round trip is messaging).
struct stage_timing {
  wire_double busy_ms = 0;
  wire_double compute_ms = 0;    ///< forward, backward, recompute
  wire_double p2p_wait_ms = 0;   ///< blocked in sends and receives to adjacent stages
  wire_double allreduce_ms = 0;  ///< blocked in the gradient all-reduce

  bool operator==(const stage_timing&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_timing& x) {
  return f(caf::meta::type_name("stage_timing"), x.busy_ms, x.compute_ms, x.p2p_wait_ms, x.allreduce_ms);
}

/// Pipeline actor -> stage: compute your part of step `step`: the pipeline's microbatches
/// [first_microbatch, first_microbatch + microbatches) of the step's global batch (the samples
/// follow from the step alone, ARCHITECTURE.md §5 "Sampler").
struct stage_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t first_microbatch = 0;
  std::int32_t microbatches = 0;

  bool operator==(const stage_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_step& x) {
  return f(caf::meta::type_name("stage_step"), x.epoch, x.step, x.first_microbatch, x.microbatches);
}

/// Stage -> pipeline actor: forward, backward and gradient all-reduce done (or failed: `error`).
struct stage_done {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t pipeline = 0;
  std::int32_t stage = 0;
  wire_double loss_sum = 0;  ///< sum of microbatch losses, last stage only
  std::string error;    ///< empty on success
  stage_timing timing;

  bool operator==(const stage_done&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_done& x) {
  return f(caf::meta::type_name("stage_done"), x.epoch, x.step, x.pipeline, x.stage, x.loss_sum, x.error, x.timing);
}

/// Pipeline actor -> coordinator.
struct pipeline_done {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t pipeline = 0;
  wire_double loss_sum = 0;
  std::string error;  ///< empty on success
  stage_timing slowest;  ///< the timing of the stage with the largest busy_ms

  bool operator==(const pipeline_done&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pipeline_done& x) {
  return f(caf::meta::type_name("pipeline_done"), x.epoch, x.step, x.pipeline, x.loss_sum, x.error, x.slowest);
}

/// Coordinator -> every node in use: the step is committed; apply the optimizer step.
struct commit_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;

  bool operator==(const commit_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, commit_step& x) {
  return f(caf::meta::type_name("commit_step"), x.epoch, x.step);
}

/// A layer's parameter digest after a commit (FNV-1a over its parameter bytes, 8-byte words at a time).
struct layer_digest {
  planning::layer_index layer;
  std::uint64_t digest = 0;

  bool operator==(const layer_digest&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_digest& x) {
  return f(caf::meta::type_name("layer_digest"), x.layer, x.digest);
}

/// Node -> coordinator: the commit is applied to every layer the node holds.
struct step_committed {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  planning::node_id node;
  std::vector<layer_digest> digests;
  wire_double commit_ms = 0;     ///< the stage's commit handling: optimizer and digests (its clock)
  wire_double optimizer_ms = 0;  ///< of which AdamW

  bool operator==(const step_committed&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_committed& x) {
  return f(caf::meta::type_name("step_committed"), x.epoch, x.step, x.node, x.digests, x.commit_ms, x.optimizer_ms);
}

}  // namespace oobleck::messages
