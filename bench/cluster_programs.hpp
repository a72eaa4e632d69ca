#pragma once
// What the benchmarks that run the cluster programs share: a program run to its end with its
// output, a file's text, the allocator in use, oobleck-local's default job, and the metrics file of
// a job.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace oobleck::bench {

/// A program run to its end: what it printed is for people (errors show it); what it did is read
/// from the files it wrote (job events, metrics).
struct program_run {
  int status = -1;  ///< the exit status, or 128 + signal
  std::vector<std::string> lines;  ///< its stdout and stderr, line by line

  /// Every line, each ending in '\n'.
  [[nodiscard]] std::string transcript() const;
};

/// Runs a program to its end (SIGTERM after timeout_s), its stdout and stderr collected.
program_run run_program(const std::string& path, const std::vector<std::string>& args, double timeout_s);

/// A whole file's text ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

/// The file that this process's `malloc` comes from ("libtcmalloc_minimal.so.4", "libc.so.6"; "" if
/// unknown): the allocator of this build's programs (CMakeLists.txt, OOBLECK_ALLOCATOR), or one
/// preloaded. Benchmarks record it beside their figures.
std::string allocator_in_use();

/// oobleck-local's default job file (`oobleck-local --print-default-job`), from the folder `bin`.
std::string default_job_text(const std::string& bin);

/// A job's --metrics-out file: its step records and its event ("reconfigured") records.
struct metrics_records {
  std::vector<nlohmann::json> steps, events;
};
metrics_records read_metrics(const std::filesystem::path& path);

}  // namespace oobleck::bench
