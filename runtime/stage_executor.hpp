#pragma once
// Runs one pipeline stage: layers [first, end) of the node's layer store, the 1F1B op list of
// planning/, the per-layer gradient all-reduce across pipelines, and the optimizer step on commit.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/communicator.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/gradient_reducer.hpp"
#include "runtime/layer_store.hpp"
#include "runtime/optimizer.hpp"

namespace oobleck::runtime {

/// Where a stage sits in its pipeline.
struct stage_position {
  int first_layer = 0;
  int end_layer = 0;  ///< layers [first_layer, end_layer)
  int stage = 0;
  int num_stages = 1;
  int prev_rank = -1;  ///< rank of stage - 1 (unused on the first stage)
  int next_rank = -1;  ///< rank of stage + 1 (unused on the last stage)
  /// Ranks of the pipeline's first and last stage: the embedding group of a model whose input and
  /// output embeddings are tied (gpt_config tied()); -1 where unknown (a one-stage pipeline).
  int first_rank = -1;
  int last_rank = -1;
};

struct executor_options {
  int microbatch_size = 1;
  /// B / b over all pipelines: each microbatch's loss is divided by it, so a step's gradient is
  /// the mean over the global batch whatever the split across pipelines.
  int global_microbatches = 1;
  bool activation_checkpointing = false;  ///< keep only stage inputs; recompute in backward
  adamw_options optimizer;
  /// Given the layer groups, run_step starts each layer's gradient all-reduce on a communication
  /// thread as soon as the layer's gradient is final (during the stage's last backward), while
  /// the rest of that backward runs. Off: reduce_gradients() runs them all after the schedule.
  /// The sums are bitwise the same either way.
  bool overlap_gradient_reduce = true;
};

/// Where a stage's time went in its last step (milliseconds of the stage's own thread; steady
/// clock). compute: forward, backward and recompute ops; p2p_wait: blocked in send and recv to
/// adjacent stages; allreduce: blocked in the gradient all-reduce (with overlap, only the wait for
/// what the communication thread has not finished when the schedule ends); optimizer: AdamW in
/// the last commit().
struct step_timing {
  double compute_ms = 0;
  double p2p_wait_ms = 0;
  double allreduce_ms = 0;
  double optimizer_ms = 0;
  /// Per microbatch of the pipeline (its local index): the forward op's and the backward op's time
  /// (a backward under activation checkpointing includes its recompute): what the step's ideal
  /// makespan is computed from (planning::one_f_one_b_makespan).
  std::vector<double> forward_op_ms, backward_op_ms;
};

/// A stage of one epoch: a view over layers [first_layer, end_layer) of the node's store, bound to
/// the epoch's communicator. It owns no layer: the store outlives it and keeps the layers when the
/// next epoch builds other views.
class stage_executor {
 public:
  /// Every layer of the range must be held by `store` (std::invalid_argument otherwise); `store`
  /// and `comm` must outlive the executor.
  stage_executor(layer_store& store, stage_position position, communicator& comm, executor_options options);

  /// The 1F1B ops of step `step` for the pipeline's `num_microbatches` microbatches, which are
  /// microbatches [first_microbatch, first_microbatch + num_microbatches) of the global batch:
  /// dropout masks follow from (model seed, step, global microbatch, layer), so any split of the
  /// batch, a re-run of the step and a recompute draw the same masks. `inputs` and `targets` are
  /// the pipeline's token ids [num_microbatches * b, seq] (read on the first / last stage only).
  /// Returns the sum of the unscaled microbatch losses on the last stage, 0 elsewhere.
  /// Throws comm_error when the data plane fails; gradients are then partial: discard() them.
  /// With `layer_groups` (as for reduce_gradients) and overlap on, the all-reduce of each layer
  /// starts during the last backward; a step that fails while some are in flight aborts this
  /// rank's communicator (the epoch is over) so that none of them outlives the step.
  double run_step(std::int64_t step, std::int64_t first_microbatch, int num_microbatches, const torch::Tensor& inputs,
                  const torch::Tensor& targets, const std::vector<std::vector<int>>& layer_groups = {});

  /// Completes the step's gradient sum: each layer's gradient over layer_groups[l], the ranks of
  /// every holder of layer l (groups of one rank are skipped), one all-reduce of the layer's flat
  /// gradient buffer. Waits for those run_step started and runs the others; layers go in
  /// decreasing order on every rank (the order a backward pass makes them final). Throws
  /// comm_error when the data plane fails.
  /// Then, for a model with tied embeddings, tie_gradients().
  void reduce_gradients(const std::vector<std::vector<int>>& layer_groups);

  /// A model with tied embeddings (gpt_config tied()): the token embedding of layer 0 and the LM
  /// head of the last layer are one matrix held twice (parameter 0 of both layers). Its gradient is
  /// the sum over both uses: the stage holding layer 0 and the one holding the last layer swap
  /// their (already all-reduced) gradients of it and each adds the other's, so both hold
  /// bitwise the same sum (float addition commutes), on every pipeline alike (the all-reduce
  /// leaves the same bits on every holder). A stage holding both adds in place. Nothing for an
  /// untied model or a stage holding neither. Throws comm_error when the data plane fails.
  void tie_gradients();

  /// Sum of the squares of the range's gradients (after reduce_gradients: the step's global
  /// gradient), counting the tied matrix once (on layer 0, not on its copy in the last layer):
  /// the pipeline's stages add up to the squared global norm that clipping uses.
  double gradient_sq_norm();

  /// The step is committed everywhere: apply AdamW to every layer of the range and drop gradients.
  /// `gradient_scale` (from global-norm clipping; 1: none) multiplies the gradients first.
  void commit(double gradient_scale = 1.0);

  /// Evaluation (no dropout, no gradients): the pipeline's forward pass over `windows` rows of
  /// `inputs` / `targets` (token ids [windows, seq]; read on the first / last stage only), in chunks
  /// of microbatch_size rows handed from stage to stage. Returns, on the last stage, the sum over
  /// the rows of each row's mean token cross-entropy; 0 elsewhere. Throws comm_error when the data
  /// plane fails.
  double run_eval(int windows, const torch::Tensor& inputs, const torch::Tensor& targets);
  /// The step failed somewhere: drop its gradients (all-reduces still in flight are cancelled
  /// first, aborting this rank's communicator).
  void discard();

  /// Where the last step's time went (run_step, reduce_gradients and commit add to it; run_step
  /// starts it afresh).
  const step_timing& last_step_timing() const { return timing_; }

  const stage_position& position() const { return position_; }
  /// Parameters of model layer l (first_layer <= l < end_layer).
  std::vector<torch::Tensor> parameters(int layer) const;
  layer_optimizer_state& optimizer_state(int layer);
  /// FNV-1a over the 8-byte words of layer l's parameters: equal digests = bitwise equal replicas.
  std::uint64_t parameter_digest(int layer) const;

 private:
  int checked(int layer) const;
  /// Forward through the range; with `boundaries`, each layer's input after the first is a
  /// detached leaf and each layer's output is kept, so backward can go layer by layer.
  torch::Tensor forward_layers(const torch::Tensor& x, std::int64_t step, std::int64_t microbatch,
                               std::vector<torch::Tensor>* boundaries);

  layer_store& store_;
  stage_position position_;
  communicator& comm_;
  executor_options options_;
  gradient_reducer reducer_;
  std::vector<bool> reduce_started_;  ///< per layer of the range, this step
  step_timing timing_;
};

}  // namespace oobleck::runtime
