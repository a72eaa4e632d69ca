#pragma once
// A byte-level tokenised text dataset: sample i is the window [i * seq_len, (i + 1) * seq_len + 1)
// of the byte stream, input its first seq_len bytes, target the next seq_len.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace oobleck::runtime {

class token_dataset {
 public:
  token_dataset(std::string text, std::int64_t seq_len);
  /// Reads a text file; throws std::runtime_error naming the path when unreadable or too short.
  static token_dataset from_file(const std::string& path, std::int64_t seq_len);

  std::int64_t size() const { return num_samples_; }
  std::int64_t seq_len() const { return seq_len_; }

  /// Input tokens [n, seq_len] and targets [n, seq_len] (int64) of the given samples.
  std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<std::int64_t>& ids) const;

 private:
  std::string text_;
  std::int64_t seq_len_;
  std::int64_t num_samples_;
};

/// A deterministic English-like corpus, so the main job and the tests need no download.
std::string default_corpus(std::size_t bytes = 1 << 20, std::uint64_t seed = 7);

}  // namespace oobleck::runtime
