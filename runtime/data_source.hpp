#pragma once
// Where a job's tokens come from, without LibTorch: the job file names it, the stages build a
// runtime::token_dataset from it (runtime/dataset.hpp), and a checkpoint's job identity includes it.

#include <cstdint>
#include <string>

namespace oobleck::runtime {

/// How token ids are stored in a token file: flat little-endian integers, as nanoGPT writes them.
enum class token_dtype : std::uint8_t { uint16, uint32 };

/// Bytes of one token id.
inline int dtype_bytes(token_dtype t) { return t == token_dtype::uint16 ? 2 : 4; }
/// "uint16" or "uint32".
std::string dtype_name(token_dtype t);
/// The dtype of that name; throws std::invalid_argument listing both names otherwise.
token_dtype parse_dtype(const std::string& name);

/// A dataset's origin. `none` only for an absent validation set.
struct data_source {
  enum class kind_t : std::uint8_t { none, generated, text, tokens };
  kind_t kind = kind_t::generated;
  std::int64_t corpus_bytes = 1 << 20;  ///< generated: runtime::default_corpus(corpus_bytes, corpus_seed)
  std::uint64_t corpus_seed = 7;
  std::string path;                     ///< text (bytes are token ids) or tokens (flat ids of dtype)
  token_dtype dtype = token_dtype::uint16;

  static data_source generated(std::int64_t bytes = 1 << 20, std::uint64_t seed = 7);
  static data_source text_file(std::string path);
  static data_source token_file(std::string path, token_dtype dtype = token_dtype::uint16);

  bool empty() const { return kind == kind_t::none; }
  /// Byte-level (generated or text): ids 0..255, so the vocabulary needs 256 entries.
  bool byte_level() const { return kind == kind_t::generated || kind == kind_t::text; }
  bool operator==(const data_source&) const = default;
};

/// One line that identifies the source (kind, path, dtype or corpus bytes and seed): for messages and
/// for a checkpoint's job identity.
std::string describe(const data_source& s);

/// Token ids the source holds without reading its values: corpus_bytes, or the file's size over
/// the dtype's. Throws std::runtime_error naming the path when the file is unreadable or its size
/// is not a multiple of the dtype's.
std::int64_t token_count(const data_source& s);

/// Samples (windows of seq_len + 1 tokens, sample i starting at token i * seq_len) in `tokens` ids.
inline std::int64_t windows_in(std::int64_t tokens, std::int64_t seq_len) {
  return seq_len < 1 || tokens < 1 ? 0 : (tokens - 1) / seq_len;
}

}  // namespace oobleck::runtime
