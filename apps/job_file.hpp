#pragma once
// Job files (TOML, read with toml++): the model and the knobs the programs share. Strict: an
// unknown section or key, a value of the wrong type or outside its range is an error naming the
// file, line and key path, so a typo never silently falls back to a default.
//
//   [model]     vocab (>= 256: the corpus is byte-level), d_model, heads, blocks, seq_len,
//               dropout (a float in [0, 1)), seed
//   [training]  microbatch, global_batch (a multiple of microbatch)
//   [cluster]   device_memory_bytes (per slot)
//   [profile]   warmup, repeats

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/gpt_config.hpp"

namespace oobleck::apps {

/// Token ids of the byte-level corpus are 0..255: a smaller vocabulary cannot embed them.
inline constexpr std::int64_t kByteVocab = 256;

struct job_file {
  runtime::gpt_config model;  ///< [model] vocab, d_model, heads, blocks, seq_len, dropout, seed
  int microbatch = 4;         ///< [training] microbatch
  int global_batch = 64;      ///< [training] global_batch
  std::int64_t device_memory_bytes = 4LL << 30;  ///< [cluster] device_memory_bytes (per slot)
  int profile_warmup = 2;                        ///< [profile] warmup
  int profile_repeats = 7;                       ///< [profile] repeats
};

/// Decodes a job file's text; origin names it in errors. Throws messages::input_error
/// "ORIGIN:LINE: ..." (or "ORIGIN: ..." for a rule across keys) on any problem.
job_file parse_job(std::string_view text, std::string_view origin = "job file");

/// Reads and decodes the file at path; an unreadable file is an input_error too.
job_file read_job_file(const std::string& path);

}  // namespace oobleck::apps
