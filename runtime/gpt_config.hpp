#pragma once
// The model a job trains, without LibTorch: actors and apps pass it around; only runtime/ builds it.

#include <cstdint>
#include <string>
#include <string_view>

namespace oobleck::runtime {

/// Which decoder the layers implement. oobleck_gpt is the project's own byte-level model (no
/// biases, exact GELU, untied head); gpt2 is GPT-2 as published (biases, tanh GELU, learned
/// positions, LM head optionally tied to the token embedding).
enum class model_architecture : std::uint8_t { oobleck_gpt, gpt2 };

/// How the layers compute (a job's training.precision). fp32: everything in float32. bf16: LibTorch's
/// autocast to bfloat16 around every forward (matrix products and attention in bf16; norms, softmax,
/// the loss and the residual stream in fp32), while the parameters, their gradients, the all-reduce
/// and AdamW stay fp32: the gradients of the fp32 parameters are the master copies, reduced in fp32.
enum class precision_kind : std::uint8_t { fp32, bf16 };

/// A GPT-style decoder as an ordered list of layers: layer 0 embeds tokens and positions, layers
/// 1..blocks are transformer blocks, the last layer is the final norm and the LM head. With
/// tie_embeddings (gpt2 only) the head holds its own copy of layer 0's token embedding, which the
/// runtime keeps equal by summing the two uses' gradients; otherwise no parameter is shared.
struct gpt_config {
  model_architecture architecture = model_architecture::oobleck_gpt;
  std::int64_t vocab = 256;  ///< byte-level tokenizer by default
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t blocks = 4;
  std::int64_t seq_len = 32;  ///< positions (GPT-2's n_positions)
  double dropout = 0.0;
  std::uint64_t seed = 1234;  ///< initialisation; layer l uses its own generator seeded from (seed, l)
  bool tie_embeddings = false;  ///< gpt2 only: the LM head is the token embedding
  /// A folder with model.safetensors + config.json in Hugging Face GPT-2 form to start from; empty
  /// means the seeded initialisation. Not part of hash(): it does not change shapes or timings.
  std::string init;
  /// Not part of hash() either: the layers' shapes and bytes are the same in both, so checkpoints
  /// and layer copies serve either; a profile records it in its device kind instead.
  precision_kind precision = precision_kind::fp32;

  int num_layers() const { return static_cast<int>(blocks) + 2; }
  /// Stable hash of every field that changes the layers' shapes or values (profiles record it).
  std::string hash() const;

  bool operator==(const gpt_config&) const = default;
};

/// gpt2 with tie_embeddings: layer 0's wte and the head's wte are one matrix held twice.
bool tied(const gpt_config& c);

/// "oobleck-gpt" or "gpt2", as job files spell it.
std::string architecture_name(model_architecture a);

/// "fp32" or "bf16", as job files spell it.
std::string precision_name(precision_kind p);
/// The inverse of precision_name; std::invalid_argument naming both spellings for anything else.
precision_kind parse_precision(std::string_view name);

/// Throws std::invalid_argument naming the bad field.
void validate(const gpt_config& c);

/// GPT-2 sizes as published: "gpt2" (124M), "gpt2-medium", "gpt2-large", "gpt2-xl". Architecture
/// gpt2, tied embeddings, vocab 50257, 1024 positions, dropout 0.1; seed and init as defaulted.
/// Throws std::invalid_argument listing the known names for any other name.
gpt_config preset(std::string_view name);

}  // namespace oobleck::runtime
