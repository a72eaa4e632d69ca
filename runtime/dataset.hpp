#pragma once
// A dataset of token ids: sample i is the window [i * seq_len, (i + 1) * seq_len + 1) of the token
// stream, input its first seq_len ids, target the next seq_len. The stream is a generated or given
// text (byte-level: each byte is a token id) or a token file (flat little-endian uint16 or uint32
// ids, memory-mapped, as nanoGPT and many tokenizer pipelines write them).

#include "runtime/corpus.hpp"
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data_source.hpp"

namespace oobleck::runtime {

class token_dataset {
 public:
  /// Byte-level: each byte of `text` is a token id.
  token_dataset(std::string text, std::int64_t seq_len);
  /// Reads a text file byte-level; throws std::runtime_error naming the path when unreadable or too short.
  static token_dataset from_file(const std::string& path, std::int64_t seq_len);
  /// Memory-maps a token file of `dtype` ids. Throws std::runtime_error naming the path when it is
  /// unreadable, its size is not a whole number of ids, it holds fewer than seq_len + 1 ids, or an
  /// id is >= vocab (with the byte offset of the first such id).
  static token_dataset from_tokens(const std::string& path, token_dtype dtype, std::int64_t seq_len, std::int64_t vocab);

  std::int64_t size() const { return num_samples_; }
  std::int64_t seq_len() const { return seq_len_; }
  /// Token ids in the stream.
  std::int64_t tokens() const { return tokens_; }

  /// Input tokens [n, seq_len] and targets [n, seq_len] (int64) of the given samples.
  std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<std::int64_t>& ids) const;

 private:
  struct storage;
  token_dataset(std::shared_ptr<const storage> s, std::int64_t seq_len, const std::string& origin);
  std::int64_t id(std::int64_t position) const;

  std::shared_ptr<const storage> data_;
  std::int64_t tokens_ = 0;
  std::int64_t seq_len_;
  std::int64_t num_samples_;
};

/// The dataset of `source` for a model of `seq_len` positions and `vocab` token ids: generated,
/// a text file or a token file. Byte-level data needs vocab >= 256; every id is checked < vocab.
/// Throws std::runtime_error naming the file (and, for a bad id, its byte offset).
token_dataset make_dataset(const data_source& source, std::int64_t seq_len, std::int64_t vocab);


}  // namespace oobleck::runtime
