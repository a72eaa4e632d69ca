#pragma once
// The GPT decoder's layers in LibTorch: the unit of planning, copying and gradient sync. Two
// architectures (gpt_config::architecture): the project's own oobleck-gpt, and GPT-2 as published,
// whose head, when tied, holds a copy of layer 0's token embedding as its first parameter.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "runtime/gpt_config.hpp"

namespace oobleck::runtime {

/// One layer of the model. Input and output are [batch, seq, d_model] float activations, except
/// layer 0 (int64 token ids in) and the last layer (logits [batch, seq, vocab] out).
class model_layer : public torch::nn::Module {
 public:
  /// `dropout` draws this forward's dropout masks, in a fixed order; it may be null only when no
  /// mask is drawn (dropout 0 or eval mode), else std::logic_error: LibTorch's global generator is
  /// never used, so that a re-run or a recompute sees the same masks (ARCHITECTURE.md §5, Randomness).
  virtual torch::Tensor forward(const torch::Tensor& x, at::Generator* dropout) = 0;
  torch::Tensor forward(const torch::Tensor& x) { return forward(x, nullptr); }
};

/// The model's precision on the calling thread while it lives: for bf16, LibTorch's autocast to
/// bfloat16 on `device`'s kind (the CPU's or the GPU's), as torch.autocast does (casts of the fp32
/// parameters are cached inside the outermost scope and dropped when it ends); nothing for fp32.
/// Every forward of the layers runs inside one (stage executor, profiler, evaluation); backward runs
/// outside, as autograd recorded the casts.
class autocast_scope {
 public:
  autocast_scope(precision_kind precision, const torch::Device& device);
  ~autocast_scope();
  autocast_scope(const autocast_scope&) = delete;
  autocast_scope& operator=(const autocast_scope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

/// How build_layers fills the parameters: from the layer's seed, or not at all (every value is
/// about to be overwritten, e.g. by a copy from another node; drawing them would be wasted time).
enum class layer_init { seeded, uninitialised };

/// Layers [first, end) of the model, initialised exactly as in any other split: layer l draws from
/// its own CPU generator seeded from (seed, l), then moves to `device`.
std::vector<std::shared_ptr<model_layer>> build_layers(const gpt_config& c, int first, int end,
                                                       torch::Device device = torch::kCPU,
                                                       layer_init how = layer_init::seeded);

/// The generator of layer l's dropout masks for global microbatch `microbatch` of step `step`:
/// a pure function of (c.seed, step, microbatch, layer), whichever pipeline or stage runs it.
/// On the CPU a CPU generator; on a GPU that GPU's own kind (Philox) with the same seed, so the masks
/// are drawn on the device with no host work: replicas on GPUs of one model draw the same bits,
/// which are not the CPU's (a GPU run's losses are compared with GPU runs).
at::Generator dropout_generator(const gpt_config& c, std::int64_t step, std::int64_t microbatch, int layer,
                                torch::Device device = torch::kCPU);

/// The causal attention mask of sequence length s on `device` (true above the diagonal: the
/// positions a query may not see), built once per (s, device) and shared by every forward on any
/// thread; read-only.
torch::Tensor causal_mask(std::int64_t s, torch::Device device);

/// Mean cross-entropy of logits [b, s, V] against targets [b, s].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace oobleck::runtime
