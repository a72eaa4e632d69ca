#pragma once
// The GPT decoder's layers in LibTorch: the unit of planning, copying and gradient sync.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "runtime/gpt_config.hpp"

namespace oobleck::runtime {

/// One layer of the model. Input and output are [batch, seq, d_model] float activations, except
/// layer 0 (int64 token ids in) and the last layer (logits [batch, seq, vocab] out).
class model_layer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// Layers [first, end) of the model, initialised exactly as in any other split: layer l draws from
/// its own CPU generator seeded from (seed, l), then moves to `device`.
std::vector<std::shared_ptr<model_layer>> build_layers(const gpt_config& c, int first, int end,
                                                       torch::Device device = torch::kCPU);

/// Mean cross-entropy of logits [b, s, V] against targets [b, s].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace oobleck::runtime
