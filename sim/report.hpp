#pragma once
// Reports of a simulation: a table, a JSON object and a throughput-over-time PNG (via gnuplot).

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "sim/recovery_costs.hpp"
#include "sim/simulator.hpp"

namespace oobleck::sim {

/// What was simulated, for the report's header.
struct run_description {
  std::string model;
  std::string trace;
  int nodes = 0;
  int fault_tolerance = 0;
  int global_batch = 0;
  int microbatch = 0;
  int bamboo_microbatch = 0;
  double ready_delay_ms = 0;
  double time_scale = 1;
};

/// The table: samples/s, samples and the time breakdown (percent of wall time) per policy, then
/// the ratios of Oobleck's throughput to the others'.
void print_report(std::ostream& out, const run_description& d, const recovery_costs& costs,
                  const std::vector<policy_result>& results);

/// {"model", "trace", ..., "recovery_costs": {...}, "policies": [{"policy", "samples_per_s",
/// "samples", "never_runs", "breakdown_s": {...}, "decisions": [...], "series": {...}}],
/// "ratios": {...}}.
nlohmann::json report_json(const run_description& d, const recovery_costs& costs,
                           const std::vector<policy_result>& results, int bins = 300);

nlohmann::json costs_json(const recovery_costs& c);

/// Oobleck's samples/s over another policy's (infinity when the other is 0 and Oobleck is not).
double throughput_ratio(const policy_result& oobleck, const policy_result& other);

/// The full path of gnuplot on PATH, or empty.
std::string find_gnuplot();

/// Writes a PNG of throughput over time (one line per policy, `bins` windows) with gnuplot.
/// messages::input_error when gnuplot is not installed; std::runtime_error when it fails.
void plot_throughput(const std::string& png_path, const run_description& d, const std::vector<policy_result>& results,
                     int bins = 300);

}  // namespace oobleck::sim
