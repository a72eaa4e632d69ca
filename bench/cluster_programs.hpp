#pragma once
// What the benchmarks that run the cluster programs share: a program run to its end with its
// output stamped line by line, oobleck-local's default job, and the metrics file of a job.

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace oobleck::bench {

/// A line of a program's output and when it arrived.
struct program_line {
  double unix_ms = 0;  ///< system clock: comparable with the metrics' unix_ms
  std::string text;
};

struct program_run {
  int status = -1;  ///< the exit status, or 128 + signal
  std::vector<program_line> lines;

  /// Every line, each ending in '\n'.
  [[nodiscard]] std::string transcript() const;
  /// The arrival of the first line containing `what` (NaN: none).
  [[nodiscard]] double first(const std::string& what) const;
};

/// Runs a program to its end (SIGTERM after timeout_s), its stdout and stderr stamped line by line.
program_run run_program(const std::string& path, const std::vector<std::string>& args, double timeout_s);

/// oobleck-local's default job file (`oobleck-local --print-default-job`), from the folder `bin`.
std::string default_job_text(const std::string& bin);

/// A job's --metrics-out file: its step records and its event ("reconfigured") records.
struct metrics_records {
  std::vector<nlohmann::json> steps, events;
};
metrics_records read_metrics(const std::filesystem::path& path);

}  // namespace oobleck::bench
