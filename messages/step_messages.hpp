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
//
// Run-ahead (the default in the programs): when the step after a commit starts at once (no
// evaluation, checkpoint or join due, not the job's last), the coordinator sends its run_step with
// the commit (commit_step::with_run, run_step::commit_first). Every node still applies the commit
// before anything of the next step; the commit's round trip is off the step's critical path.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "messages/wire_double.hpp"
#include "planning/ids.hpp"

namespace oobleck::messages {

/// Coordinator -> every node in use: the step is committed; apply the optimizer step, after
/// multiplying the gradients by `grad_scale` (global-norm clipping: one factor for every replica,
/// so they stay bitwise equal; 1: none).
struct commit_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  wire_double grad_scale = 1.0;
  /// Whether the node reports every committed layer's digest in step_committed: where the
  /// coordinator checks the replicas ([faults] digest_every, the first commit of an epoch, the
  /// job's last step, an adoption); hashing every layer is a pass over all parameters.
  bool digests = true;
  /// The node's stages receive the next step's orders together with this commit
  /// (stage_step::commit_first): it is applied where it arrives first, once, and the node answers
  /// as soon as it is applied, not after the next step (ARCHITECTURE.md §11 "Orders that ride with
  /// the commit").
  bool with_run = false;

  bool operator==(const commit_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, commit_step& x) {
  return f(caf::meta::type_name("commit_step"), x.epoch, x.step, x.grad_scale, x.digests, x.with_run);
}

/// Coordinator -> pipeline actor: run step `step` of epoch `epoch`; or, with `eval`, evaluate the
/// weights committed before step `step` on validation windows [first_window, first_window +
/// windows) (ARCHITECTURE.md §5 "Evaluation").
struct run_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  bool eval = false;
  std::int32_t first_window = 0;
  std::int32_t windows = 0;
  /// Sent with the commit of step `step` - 1 (the coordinator's run-ahead): every stage applies
  /// `commit` before it runs this step, where it has not been applied yet (its node's monitor
  /// receives the same commit; whichever comes first applies it, once).
  bool commit_first = false;
  commit_step commit;

  bool operator==(const run_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_step& x) {
  return f(caf::meta::type_name("run_step"), x.epoch, x.step, x.eval, x.first_window, x.windows, x.commit_first,
           x.commit);
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
/// With `eval`: the forward pass only, over validation windows [first_microbatch, first_microbatch
/// + microbatches) (here windows, not microbatches), no dropout, nothing to commit.
struct stage_step {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t first_microbatch = 0;
  std::int32_t microbatches = 0;
  bool eval = false;
  bool commit_first = false;  ///< run_step::commit_first: apply `commit` first, unless applied already
  commit_step commit;

  bool operator==(const stage_step&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_step& x) {
  return f(caf::meta::type_name("stage_step"), x.epoch, x.step, x.first_microbatch, x.microbatches, x.eval,
           x.commit_first, x.commit);
}

/// Stage -> pipeline actor: forward, backward and gradient all-reduce done (or failed: `error`).
struct stage_done {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t pipeline = 0;
  std::int32_t stage = 0;
  wire_double loss_sum = 0;  ///< sum of microbatch losses (eval: of window losses), last stage only
  std::string error;    ///< empty on success
  stage_timing timing;
  /// The squared norm of the stage's part of the step's global gradient (stage_executor::
  /// gradient_sq_norm), when the job clips gradients; 0 otherwise.
  wire_double grad_sq = 0;
  /// Per microbatch of the pipeline: the stage's forward and backward op times (ms), from which
  /// the pipeline computes the step's ideal 1F1B makespan.
  std::vector<wire_double> forward_ms;
  std::vector<wire_double> backward_ms;

  bool operator==(const stage_done&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_done& x) {
  return f(caf::meta::type_name("stage_done"), x.epoch, x.step, x.pipeline, x.stage, x.loss_sum, x.error, x.timing,
           x.grad_sq, x.forward_ms, x.backward_ms);
}

/// Pipeline actor -> coordinator.
struct pipeline_done {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int32_t pipeline = 0;
  wire_double loss_sum = 0;
  std::string error;  ///< empty on success
  stage_timing slowest;  ///< the timing of the stage with the largest busy_ms
  /// The stages' grad_sq added in stage order: the squared global gradient norm as this pipeline
  /// sees it (pipelines split the sum differently, so their last bits may differ).
  wire_double grad_sq = 0;
  bool eval = false;  ///< the answer to an evaluation round
  /// The step's 1F1B makespan from its stages' own op times (planning::one_f_one_b_makespan) plus
  /// the longest all-reduce wait of its stages: the pipeline's step with nothing but its compute
  /// and its gradient sum. 0 when a stage did not report its op times.
  wire_double ideal_ms = 0;

  bool operator==(const pipeline_done&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pipeline_done& x) {
  return f(caf::meta::type_name("pipeline_done"), x.epoch, x.step, x.pipeline, x.loss_sum, x.error, x.slowest,
           x.grad_sq, x.eval, x.ideal_ms);
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
  wire_double commit_ms = 0;     ///< the stage's commit handling: optimizer and digests, unless they were
                                 ///< computed while the next step ran (ARCHITECTURE.md §11) (its clock)
  wire_double optimizer_ms = 0;  ///< of which AdamW
  /// A tied-embedding model: the digest of the tied matrix alone in each of layer 0 and the last
  /// layer the node holds (their whole-layer digests differ; these must all be equal).
  std::vector<layer_digest> tied_digests;

  bool operator==(const step_committed&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_committed& x) {
  return f(caf::meta::type_name("step_committed"), x.epoch, x.step, x.node, x.digests, x.commit_ms, x.optimizer_ms,
           x.tied_digests);
}

}  // namespace oobleck::messages
