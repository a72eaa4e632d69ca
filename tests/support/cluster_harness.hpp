#pragma once
// Runs pipelines of stage executors on threads over a fake_hub, and the plain single-loop LibTorch
// training they must equal.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "runtime/dataset.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/optimizer.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stage_executor.hpp"
#include "support/fake_communicator.hpp"
#include "support/multiprocess_scenario.hpp"

namespace oobleck::testing {

struct training_setup {
  runtime::gpt_config model;
  int global_batch = 16;
  int microbatch = 2;
  int steps = 5;
  std::uint64_t data_seed = 99;
  runtime::adamw_options optimizer;
  bool activation_checkpointing = false;
};

/// A pipeline: layer ranges of its stages, in order, and its microbatches per step.
struct pipeline_shape {
  std::vector<std::pair<int, int>> stages;
  int microbatches = 0;
};

struct training_result {
  std::vector<std::vector<torch::Tensor>> parameters;  ///< [layer] from the first pipeline holding it
  std::vector<std::vector<std::uint64_t>> digests;     ///< [layer][pipeline]
  std::vector<double> losses;                          ///< mean loss per step
  std::vector<std::vector<torch::Tensor>> first_gradients;  ///< [layer] step 0, after all-reduce
  /// A tied-embedding model: the tied matrix's digest in every holder of layer 0 and the last layer.
  std::vector<std::uint64_t> tied_digests;
  std::vector<double> grad_norms;  ///< per step, with clipping (optimizer.clip_norm > 0)
};

training_setup small_setup();
const runtime::token_dataset& test_dataset(std::int64_t seq_len);

/// Plain LibTorch: all layers in one loop, the whole global batch at once (microbatch by
/// microbatch when the model has dropout: masks belong to global microbatches),
/// torch::optim::AdamW with the same hyper-parameters and schedule (not the project's AdamW, which
/// is under test). A tied-embedding model: the gradients of both uses of the matrix are added and
/// both copies take that sum (one matrix, as Hugging Face ties it, updated in two places alike).
/// Clipping (optimizer.clip_norm): torch::nn::utils::clip_grad_norm_ over every parameter, the tied
/// matrix once.
training_result train_reference(const training_setup& s);

/// The pipelines on threads (one per stage) with the 1F1B executor and per-layer all-reduce.
training_result train_pipelines(const training_setup& s, const std::vector<pipeline_shape>& pipelines);

/// Largest relative error of any tensor: ||a - b|| / ||b|| (Frobenius norms), over [layer][tensor].
double max_relative_difference(const std::vector<std::vector<torch::Tensor>>& a,
                               const std::vector<std::vector<torch::Tensor>>& b);
inline double max_relative_difference(const training_result& a, const training_result& b) {
  return max_relative_difference(a.parameters, b.parameters);
}
/// Largest elementwise error relative to its tensor's largest magnitude: max |a - b| / max |b|.
double max_elementwise_difference(const training_result& a, const training_result& b);

}  // namespace oobleck::testing
