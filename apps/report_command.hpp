#pragma once
// oobleck-report: a run's metrics file (what oobleck-coordinator / oobleck-local --metrics-out
// write) summed up in text, or drawn as the dashboard draws it (loss and eval loss, samples/s over
// the steps, reconfigurations marked) into a PNG with gnuplot. No LibTorch, no CAF.
//
//   oobleck-report METRICS.jsonl [--json] [--plot OUT.png]

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// What a metrics file says about its run.
struct run_metrics {
  struct step {
    std::uint64_t step = 0, epoch = 0;
    double loss = 0;
    std::int64_t samples = 0;
    double wall_ms = 0;
  };
  struct eval {
    std::uint64_t step = 0;
    double loss = 0;
    std::int64_t windows = 0;
  };
  struct reconfiguration {
    std::uint64_t epoch = 0, step = 0;  ///< the epoch that took over, the step it resumed at
    std::string action;
    std::vector<std::int64_t> lost, joined;
    double downtime_ms = 0;
  };
  std::vector<step> steps;  ///< by step; a step recorded again (a resumed run) keeps its last record
  std::vector<eval> evals;
  std::vector<reconfiguration> reconfigurations;
  std::size_t repeated_steps = 0;  ///< step records replaced by a later one of the same step
};

/// Reads a metrics file: step lines (no "event" key) and "eval" and "reconfigured" records; other
/// records are skipped, as are blank lines. messages::input_error "PATH:LINE: ..." for a line that
/// is not JSON or a record without the fields it needs.
run_metrics read_run_metrics(const std::string& path);

/// The summary: steps, final and lowest loss, best eval loss, mean samples/s (all samples over the
/// time of all steps), reconfigurations.
void print_run_summary(std::ostream& out, const std::string& path, const run_metrics& m);

int run_report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
