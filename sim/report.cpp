#include "sim/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "messages/input_error.hpp"

namespace oobleck::sim {

namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

const policy_result* find(const std::vector<policy_result>& rs, const std::string& name) {
  for (const auto& r : rs)
    if (r.policy == name) return &r;
  return nullptr;
}

std::string ratio_text(double x) {
  if (std::isinf(x)) return "inf (the other completes nothing)";
  if (std::isnan(x)) return "n/a (neither completes anything)";
  return fmt("%.2fx", x);
}

}  // namespace

double throughput_ratio(const policy_result& oobleck, const policy_result& other) {
  if (other.samples_per_s > 0) return oobleck.samples_per_s / other.samples_per_s;
  return oobleck.samples_per_s > 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
}

void print_report(std::ostream& out, const run_description& d, const recovery_costs& costs,
                  const std::vector<policy_result>& results) {
  const double seconds = results.empty() ? 0 : (results[0].end_ms - results[0].start_ms) / 1e3;
  out << "model " << d.model << ", trace " << d.trace << ": " << fmt("%.0f", seconds) << " s simulated, at most "
      << d.nodes << " nodes, f = " << d.fault_tolerance << ", B = " << d.global_batch << ", b = " << d.microbatch
      << " (Bamboo b = " << d.bamboo_microbatch << "), nodes ready " << fmt("%g", d.ready_delay_ms / 1e3)
      << " s after they are added";
  if (d.time_scale != 1) out << ", trace times x " << fmt("%g", d.time_scale);
  out << "\nrecovery costs: " << costs.source << "\n\n";
  out << "policy     samples/s       samples  effective  redundant  fallback  reconfig  checkpoint  restart  stopped\n";
  for (const auto& r : results) {
    out << r.policy << std::string(r.policy.size() < 8 ? 8 - r.policy.size() : 0, ' ') << fmt("%12.3f", r.samples_per_s) << fmt("%14.0f", r.samples);
    const double total = r.end_ms - r.start_ms;
    const int widths[kActivities] = {11, 11, 10, 10, 12, 9, 9};
    for (int a = 0; a < kActivities; ++a) {
      const double pct = total > 0 ? 100 * r.breakdown_ms[a] / total : 0;
      out << fmt(("%" + std::to_string(widths[a] - 1) + ".1f%%").c_str(), pct);
    }
    out << "\n";
  }
  out << "\neffective training time (samples over the policy's failure-free rate x wall time) and time lost (h):\n"
      << "policy        failure-free/s  effective  fallback  reconfig  checkpoint  restart  stopped  slower\n";
  // Hours; a rounding residue (|x| < 1 ms) prints as 0 rather than -0.00.
  auto h = [](double ms) { return std::abs(ms) < 1 ? 0.0 : ms / 3600e3; };
  for (const auto& r : results) {
    const auto lost = lost_time(r);
    std::string name = r.policy;
    name.resize(std::max<std::size_t>(name.size(), 12), ' ');
    out << name << fmt("%16.3f", r.failure_free_samples_per_s) << fmt("%10.1f%%", 100 * effective_share(r))
        << fmt("%10.2f", h(lost.fallback)) << fmt("%10.2f", h(lost.reconfiguration)) << fmt("%12.2f", h(lost.checkpoint))
        << fmt("%9.2f", h(lost.restart)) << fmt("%9.2f", h(lost.stopped)) << fmt("%8.2f", h(lost.slower)) << "\n";
  }
  for (const auto& r : results)
    if (!r.never_runs.empty()) out << r.policy << ": " << r.never_runs << "\n";
  if (const auto* o = find(results, "oobleck")) {
    for (const char* other : {"varuna", "bamboo", "ckpt-restart", "torchft"})
      if (const auto* r = find(results, other))
        out << "Oobleck / " << other << ": " << ratio_text(throughput_ratio(*o, *r)) << "\n";
  }
  for (const auto& r : results) {
    int counts[3] = {0, 0, 0};
    for (const auto& dec : r.decisions) {
      if (dec.what == "reconfigure" || dec.what == "takeover" || dec.what == "shrink" || dec.what == "grow" ||
          dec.what == "resume")
        ++counts[0];
      else if (dec.what == "restart" || dec.what == "morph") ++counts[1];
      else if (dec.what == "stop") ++counts[2];
    }
    out << r.policy << ": " << counts[0] << " reconfigurations without restart, " << counts[1] << " restarts, "
        << counts[2] << " stops\n";
  }
}

nlohmann::json costs_json(const recovery_costs& c) {
  return {{"detection_ms", c.detection_ms},
          {"planning_ms", c.planning_ms},
          {"copy_bytes_per_s", c.copy_bytes_per_s},
          {"checkpoint_fixed_ms", c.checkpoint_fixed_ms},
          {"storage_bytes_per_s", c.storage_bytes_per_s},
          {"restart_fixed_ms", c.restart_fixed_ms},
          {"load_bytes_per_s", c.load_bytes_per_s},
          {"varuna_checkpoint_every_steps", c.varuna_checkpoint_every_steps},
          {"bamboo_redundancy_factor", c.bamboo_redundancy_factor},
          {"bamboo_takeover_ms", c.bamboo_takeover_ms},
          {"snapshot_bytes_per_s", c.snapshot_bytes_per_s},
          {"checkpoint_interval_s", c.checkpoint_interval_s},
          {"spare_groups", c.spare_groups},
          {"source", c.source}};
}

nlohmann::json report_json(const run_description& d, const recovery_costs& costs,
                           const std::vector<policy_result>& results, int bins) {
  nlohmann::json policies = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json breakdown = nlohmann::json::object();
    for (int a = 0; a < kActivities; ++a) breakdown[to_string(static_cast<activity>(a))] = r.breakdown_ms[a] / 1e3;
    nlohmann::json decisions = nlohmann::json::array();
    for (const auto& dec : r.decisions)
      decisions.push_back({{"t_s", dec.ms / 1e3},
                           {"what", dec.what},
                           {"nodes", dec.nodes_in_use},
                           {"step_s", dec.step_ms / 1e3},
                           {"detail", dec.detail}});
    const auto series = throughput_series(r, bins);
    policies.push_back({{"policy", r.policy},
                        {"samples_per_s", r.samples_per_s},
                        {"samples", r.samples},
                        {"never_runs", r.never_runs.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.never_runs)},
                        {"breakdown_s", breakdown},
                        {"failure_free_samples_per_s", r.failure_free_samples_per_s},
                        {"effective_share", effective_share(r)},
                        {"lost_s",
                         {{"fallback", lost_time(r).fallback / 1e3},
                          {"reconfiguration", lost_time(r).reconfiguration / 1e3},
                          {"checkpoint", lost_time(r).checkpoint / 1e3},
                          {"restart", lost_time(r).restart / 1e3},
                          {"stopped", lost_time(r).stopped / 1e3},
                          {"redundant", lost_time(r).redundant / 1e3},
                          {"slower", lost_time(r).slower / 1e3}}},
                        {"decisions", decisions},
                        {"series", {{"window_s", (r.end_ms - r.start_ms) / 1e3 / bins}, {"samples_per_s", series}}}});
  }
  nlohmann::json ratios = nlohmann::json::object();
  if (const auto* o = find(results, "oobleck"))
    for (const char* other : {"varuna", "bamboo", "ckpt-restart", "torchft"})
      if (const auto* r = find(results, other)) {
        const double x = throughput_ratio(*o, *r);
        ratios[std::string("oobleck/") + other] = std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
      }
  const double start = results.empty() ? 0 : results[0].start_ms, end = results.empty() ? 0 : results[0].end_ms;
  return {{"model", d.model},
          {"trace", d.trace},
          {"nodes", d.nodes},
          {"fault_tolerance", d.fault_tolerance},
          {"global_batch", d.global_batch},
          {"microbatch", d.microbatch},
          {"bamboo_microbatch", d.bamboo_microbatch},
          {"ready_delay_s", d.ready_delay_ms / 1e3},
          {"time_scale", d.time_scale},
          {"start_s", start / 1e3},
          {"end_s", end / 1e3},
          {"recovery_costs", costs_json(costs)},
          {"policies", policies},
          {"ratios", ratios}};
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return {};
}

void plot_throughput(const std::string& png_path, const run_description& d, const std::vector<policy_result>& results,
                     int bins) {
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    throw messages::input_error("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
  if (results.empty()) return;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("oobleck-sim-plot-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path data = dir / "throughput.dat", script = dir / "plot.gp";
  const double span_s = (results[0].end_ms - results[0].start_ms) / 1e3;
  const bool hours = span_s > 3 * 3600;
  const double unit = hours ? 3600 : 60;
  {
    std::ofstream f(data);
    std::vector<std::vector<double>> series;
    for (const auto& r : results) series.push_back(throughput_series(r, bins));
    for (int i = 0; i < bins; ++i) {
      f << fmt("%.6g", (results[0].start_ms / 1e3 + span_s * (i + 0.5) / bins) / unit);
      for (const auto& s : series) f << " " << fmt("%.6g", s[i]);
      f << "\n";
    }
  }
  auto quoted = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
    return q + "'";
  };
  {
    std::ofstream f(script);
    f << "set terminal pngcairo size 1000,500 noenhanced\n";
    f << "set output " << quoted(png_path) << "\n";
    f << "set title " << quoted(d.model + " on " + fs::path(d.trace).filename().string() + " (" +
                                std::to_string(d.nodes) + " nodes at most)")
      << "\n";
    f << "set xlabel " << quoted(hours ? "time (hours)" : "time (minutes)") << "\n";
    f << "set ylabel 'throughput (samples/s)'\nset yrange [0:*]\nset key outside right\nset grid\n";
    f << "plot ";
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (i) f << ", ";
      f << quoted(data.string()) << " using 1:" << i + 2 << " with lines lw 2 title "
        << quoted(results[i].policy + " (" + fmt("%.3g", results[i].samples_per_s) + " samples/s)");
    }
    f << "\n";
  }
  auto shell = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const std::string command = shell(gnuplot) + " " + shell(script.string()) + " 2>&1";
  const int status = std::system(command.c_str());
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  if (status != 0) throw std::runtime_error("gnuplot failed to write " + png_path + " (status " + std::to_string(status) + ")");
}

}  // namespace oobleck::sim
