#pragma once
// Job files (TOML): the model and the knobs the programs share. The subset parsed is sections,
// `key = value` with integers, floats, booleans and "strings", and # comments; unknown sections or
// keys are errors, so a typo never silently falls back to a default.

#include <cstdint>
#include <string>

#include "runtime/gpt_config.hpp"

namespace oobleck::apps {

struct job_file {
  runtime::gpt_config model;  ///< [model] vocab, d_model, heads, blocks, seq_len, dropout, seed
  int microbatch = 4;         ///< [training] microbatch
  int global_batch = 64;      ///< [training] global_batch
  std::int64_t device_memory_bytes = 4LL << 30;  ///< [cluster] device_memory_bytes (per slot)
  int profile_warmup = 2;                        ///< [profile] warmup
  int profile_repeats = 7;                       ///< [profile] repeats
};

/// Parses a job file's text; throws planning::planning_error "JOB:LINE: ..." on any problem.
job_file parse_job_file(const std::string& text, const std::string& name = "job file");
job_file read_job_file(const std::string& path);

}  // namespace oobleck::apps
