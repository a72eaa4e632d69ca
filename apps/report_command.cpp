#include "apps/report_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/flags.hpp"
#include "messages/input_error.hpp"
#include "runtime/child_process.hpp"
#include "sim/report.hpp"

namespace oobleck::apps {

namespace {

using messages::input_error;
namespace fs = std::filesystem;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// The field `key` of a record, of the type asked; input_error naming the field otherwise.
template <class T>
T field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) throw input_error(std::string("no \"") + key + "\"");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) throw input_error(std::string("\"") + key + "\" is not a string");
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!it->is_number_unsigned()) throw input_error(std::string("\"") + key + "\" is not a count (an integer >= 0)");
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) throw input_error(std::string("\"") + key + "\" is not an integer");
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const auto& x) { return x.is_number_integer(); }))
      throw input_error(std::string("\"") + key + "\" is not a list of integers");
  } else {
    // A loss the run could not compute is written as null by some writers: NaN here.
    if (it->is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!it->is_number()) throw input_error(std::string("\"") + key + "\" is not a number");
  }
  return it->get<T>();
}

template <class T>
T field_or(const nlohmann::json& j, const char* key, T fallback) {
  return j.contains(key) ? field<T>(j, key) : fallback;
}

std::string ids(const std::vector<std::int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

/// Mean samples/s: every sample over the time of every step (steps without a time count for none).
double mean_samples_per_second(const run_metrics& m) {
  double samples = 0, ms = 0;
  for (const auto& s : m.steps)
    if (s.wall_ms > 0) {
      samples += static_cast<double>(s.samples);
      ms += s.wall_ms;
    }
  return ms > 0 ? 1000.0 * samples / ms : std::numeric_limits<double>::quiet_NaN();
}

nlohmann::ordered_json summary_json(const run_metrics& m) {
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
  nlohmann::ordered_json j;
  j["steps"] = m.steps.size();
  j["first_step"] = m.steps.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(m.steps.front().step);
  j["last_step"] = m.steps.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(m.steps.back().step);
  j["repeated_steps"] = m.repeated_steps;
  j["final_loss"] = m.steps.empty() ? nlohmann::ordered_json() : number(m.steps.back().loss);
  const run_metrics::step* lowest = nullptr;
  for (const auto& s : m.steps)
    if (std::isfinite(s.loss) && (!lowest || s.loss < lowest->loss)) lowest = &s;
  j["lowest_loss"] = lowest ? nlohmann::ordered_json{{"step", lowest->step}, {"loss", lowest->loss}} : nlohmann::ordered_json();
  const run_metrics::eval* best = nullptr;
  for (const auto& e : m.evals)
    if (std::isfinite(e.loss) && (!best || e.loss < best->loss)) best = &e;
  j["evals"] = m.evals.size();
  j["best_eval"] = best ? nlohmann::ordered_json{{"step", best->step}, {"loss", best->loss}, {"windows", best->windows}}
                        : nlohmann::ordered_json();
  j["final_eval"] = m.evals.empty() ? nlohmann::ordered_json()
                                    : nlohmann::ordered_json{{"step", m.evals.back().step},
                                                             {"loss", number(m.evals.back().loss)},
                                                             {"windows", m.evals.back().windows}};
  j["mean_samples_per_second"] = number(mean_samples_per_second(m));
  double ms = 0;
  for (const auto& s : m.steps) ms += s.wall_ms;
  j["mean_step_ms"] = m.steps.empty() ? nlohmann::ordered_json() : number(ms / static_cast<double>(m.steps.size()));
  j["reconfigurations"] = m.reconfigurations.size();
  return j;
}

std::string quoted(const std::string& s) {  // a gnuplot string
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

/// Loss and eval loss over the steps above, samples/s below, reconfigurations as dashed lines.
void plot(const std::string& png, const std::string& title, const run_metrics& m) {
  const std::string gnuplot = sim::find_gnuplot();
  if (gnuplot.empty()) throw input_error("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
  if (m.steps.empty()) throw input_error("--plot: the metrics file has no step records: nothing to draw");
  const fs::path dir = fs::temp_directory_path() / ("oobleck-report-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct remove_dir {
    fs::path d;
    ~remove_dir() {
      std::error_code ignored;
      fs::remove_all(d, ignored);
    }
  } cleanup{dir};
  const fs::path steps = dir / "steps.dat", evals = dir / "evals.dat", script = dir / "plot.gp", log = dir / "gnuplot.log";
  {
    std::ofstream f(steps);
    for (const auto& s : m.steps)
      f << s.step << " " << (std::isfinite(s.loss) ? fmt("%.9g", s.loss) : "NaN") << " "
        << (s.wall_ms > 0 ? fmt("%.9g", 1000.0 * static_cast<double>(s.samples) / s.wall_ms) : "NaN") << "\n";
  }
  {
    std::ofstream f(evals);
    for (const auto& e : m.evals) f << e.step << " " << (std::isfinite(e.loss) ? fmt("%.9g", e.loss) : "NaN") << "\n";
  }
  {
    std::ofstream f(script);
    f << "set terminal pngcairo size 1100,750 noenhanced\n";
    f << "set output " << quoted(png) << "\n";
    f << "set datafile missing 'NaN'\nset grid\nset key above horizontal\n";
    const double x0 = static_cast<double>(m.steps.front().step), x1 = static_cast<double>(m.steps.back().step);
    f << "set xrange [" << fmt("%.17g", x0) << ":" << fmt("%.17g", x1 > x0 ? x1 : x0 + 1) << "]\n";
    for (std::size_t i = 0; i < m.reconfigurations.size(); ++i)
      f << "set arrow " << i + 1 << " from " << m.reconfigurations[i].step << ", graph 0 to "
        << m.reconfigurations[i].step << ", graph 1 nohead dashtype 2 linecolor rgb '#d97706' linewidth 1.5\n";
    f << "set multiplot layout 2,1\n";
    f << "set title " << quoted(title) << "\nset ylabel 'loss'\n";
    f << "plot " << quoted(steps.string()) << " using 1:2 with lines linewidth 2 linecolor rgb '#2563eb' title 'training loss'";
    if (!m.evals.empty())
      f << ", " << quoted(evals.string())
        << " using 1:2 with linespoints pointtype 7 linewidth 2 dashtype 2 linecolor rgb '#dc2626' title 'eval loss'";
    if (!m.reconfigurations.empty())  // a legend entry for the marks (the arrows have none)
      f << ", NaN with lines dashtype 2 linecolor rgb '#d97706' title 'reconfiguration'";
    f << "\nunset title\nset xlabel 'step'\nset ylabel 'samples/s'\nset yrange [0:*]\n";
    f << "plot " << quoted(steps.string())
      << " using 1:3 with lines linewidth 2 linecolor rgb '#059669' title 'samples/s'\nunset multiplot\n";
  }
  runtime::child_process p(gnuplot, {script.string()}, {.out = runtime::child_output::file(log.string())});
  if (const int status = p.wait(); status != 0) {
    std::ifstream in(log);
    std::ostringstream said;
    said << in.rdbuf();
    throw std::runtime_error("gnuplot failed to write " + png + " (status " + std::to_string(status) + "): " + said.str());
  }
}

}  // namespace

run_metrics read_run_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(path + ": cannot open the metrics file");
  run_metrics m;
  std::map<std::uint64_t, run_metrics::step> steps;
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) throw input_error("not a JSON object");
      if (!j.contains("event")) {
        run_metrics::step s{field<std::uint64_t>(j, "step"), field_or<std::uint64_t>(j, "epoch", 0),
                            field<double>(j, "loss"), field_or<std::int64_t>(j, "samples", 0),
                            field_or<double>(j, "wall_ms", 0)};
        if (!steps.emplace(s.step, s).second) {
          steps[s.step] = s;
          ++m.repeated_steps;
        }
        continue;
      }
      const auto kind = field<std::string>(j, "event");
      if (kind == "eval") {
        m.evals.push_back({field<std::uint64_t>(j, "step"), field<double>(j, "loss"), field<std::int64_t>(j, "windows")});
      } else if (kind == "reconfigured") {
        m.reconfigurations.push_back({field<std::uint64_t>(j, "epoch"), field<std::uint64_t>(j, "resumed_step"),
                                      field<std::string>(j, "action"), field<std::vector<std::int64_t>>(j, "lost"),
                                      field<std::vector<std::int64_t>>(j, "joined"),
                                      field_or<double>(j, "downtime_ms", 0)});
      }  // other records (checkpoint_and_stop, ...) say nothing this report shows
    } catch (const input_error& e) {
      throw input_error(path + ":" + std::to_string(number) + ": " + e.what());
    } catch (const nlohmann::json::exception& e) {
      throw input_error(path + ":" + std::to_string(number) + ": " + e.what());
    }
  }
  for (auto& [k, s] : steps) m.steps.push_back(s);
  std::stable_sort(m.evals.begin(), m.evals.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return m;
}

void print_run_summary(std::ostream& out, const std::string& path, const run_metrics& m) {
  const auto j = summary_json(m);
  out << path << ": ";
  if (m.steps.empty()) {
    out << "no committed steps\n";
  } else {
    out << m.steps.size() << " committed step(s), steps " << m.steps.front().step << ".." << m.steps.back().step;
    if (m.repeated_steps > 0) out << " (" << m.repeated_steps << " recorded again by a resumed run: the last record of each counts)";
    out << "\n";
    out << "  loss: final " << fmt("%.6g", m.steps.back().loss) << " at step " << m.steps.back().step;
    if (!j["lowest_loss"].is_null())
      out << ", lowest " << fmt("%.6g", j["lowest_loss"]["loss"].get<double>()) << " at step "
          << j["lowest_loss"]["step"].get<std::uint64_t>();
    out << "\n";
    const auto& speed = j["mean_samples_per_second"];
    out << "  samples/s: mean " << (speed.is_null() ? std::string("n/a") : fmt("%.1f", speed.get<double>()))
        << " (all samples over the time of all steps); step time: mean "
        << (j["mean_step_ms"].is_null() ? std::string("n/a") : fmt("%.1f", j["mean_step_ms"].get<double>())) << " ms\n";
  }
  if (j["best_eval"].is_null()) {
    out << "  eval loss: none recorded\n";
  } else {
    out << "  eval loss: best " << fmt("%.6g", j["best_eval"]["loss"].get<double>()) << " at step "
        << j["best_eval"]["step"].get<std::uint64_t>() << " (" << j["best_eval"]["windows"].get<std::int64_t>()
        << " windows); final " << fmt("%.6g", m.evals.back().loss) << " at step " << m.evals.back().step << "; "
        << m.evals.size() << " evaluation(s)\n";
  }
  out << "  reconfigurations: " << m.reconfigurations.size() << "\n";
  for (const auto& r : m.reconfigurations) {
    out << "    epoch " << r.epoch << " at step " << r.step << ": " << r.action;
    if (!r.lost.empty()) out << ", lost node(s) " << ids(r.lost);
    if (!r.joined.empty()) out << ", joined node(s) " << ids(r.joined);
    out << ", down " << fmt("%.2f", r.downtime_ms / 1000) << " s\n";
  }
}

int run_report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream&) {
  CLI::App app{"oobleck-report: sums up a run from its metrics file (what --metrics-out of oobleck-coordinator or\n"
               "oobleck-local writes: a line per committed step, and eval and reconfigured records): steps, final and\n"
               "lowest loss, best eval loss, mean samples/s, reconfigurations. With --plot, draws the dashboard's curves\n"
               "into a PNG: loss and eval loss over the steps, samples/s below, reconfigurations as dashed lines.",
               "oobleck-report"};
  std::string metrics, png;
  bool json = false;
  app.add_option("METRICS", metrics, "the metrics file (JSON lines)")->required();
  add_text(app, "--plot", png, "also draw the curves into this PNG (needs gnuplot)")->type_name("OUT.png");
  app.add_flag("--json", json, "print the summary as one JSON object instead of text");
  app.footer("Exit status: 0 done, 2 bad input (a flag, a metrics line: its number is named, no gnuplot for --plot), "
             "1 gnuplot failed.");
  if (!parse_flags(app, args, out)) return 0;
  if (!png.empty() && sim::find_gnuplot().empty())
    throw input_error("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
  const run_metrics m = read_run_metrics(metrics);
  if (json)
    out << summary_json(m).dump(2) << "\n";
  else
    print_run_summary(out, metrics, m);
  if (!png.empty()) {
    plot(png, fs::path(metrics).filename().string(), m);
    if (!json) out << "wrote " << png << "\n";
  }
  return 0;
}

}  // namespace oobleck::apps
