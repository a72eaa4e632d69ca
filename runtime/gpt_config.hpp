#pragma once
// The model a job trains, without LibTorch: actors and apps pass it around; only runtime/ builds it.

#include <cstdint>
#include <string>

namespace oobleck::runtime {

/// A GPT-style decoder as an ordered list of layers: layer 0 embeds tokens and positions, layers
/// 1..blocks are transformer blocks, the last layer is the final norm and the LM head. Input and
/// output embeddings are untied by design, so no parameter is shared across stages.
struct gpt_config {
  std::int64_t vocab = 256;  ///< byte-level tokenizer
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t blocks = 4;
  std::int64_t seq_len = 32;
  double dropout = 0.0;
  std::uint64_t seed = 1234;  ///< initialisation; layer l uses its own generator seeded from (seed, l)

  int num_layers() const { return static_cast<int>(blocks) + 2; }
  /// Stable hash of every field that changes the layers' shapes or values (profiles record it).
  std::string hash() const;

  bool operator==(const gpt_config&) const = default;
};

/// Throws std::invalid_argument naming the bad field.
void validate(const gpt_config& c);

}  // namespace oobleck::runtime
