// Issue 9's validation: does oobleck-sim predict what the local cluster does under a trace?
//
// For each case, oobleck-local replays a node availability trace on this machine
// (`--trace FILE --time-scale X --trace-nodes N`: removals are kill -9 of workers, later adds
// start workers that join) and its average throughput is measured: committed samples per second
// over the replay window (the first epoch formed -> the trace's last time scaled), counted from the
// --metrics-out step lines (their unix_ms). The simulator (sim/ library: the same planner, the
// Oobleck policy) replays the SAME node subset (sim/replay_schedule.hpp's replay_trace) with the
// SAME time scale, and predicts the average throughput from:
//   - a profile of the local job's model measured here by oobleck-profile (the local job runs on
//     the same profile, [profile] file, so the coordinator and the simulator plan alike);
//   - the measured recovery costs (bench/results/recovery.json: detection, planning, copy rate);
//   - a measured contention model: on 2 cores, n worker processes share the machine, and a step of
//     n nodes does not take what one process's profile predicts. Separate failure-free calibration
//     runs (n = each node count the replays train on, once before the replays and once after, the
//     mean used) measure the mean step interval, and the simulator multiplies the planner's step
//     time for n nodes by measured(n) / planned(n);
//   - the readiness delay of a join: measured in a separate calibration run (--join-at), from the
//     worker's start to its admission by the coordinator (not the 45 s of the cloud simulators).
// Nothing is fitted to the replay being predicted: every input comes from runs before it.
//
// usage: sim_validation [--quick] [--json PATH] [--bin DIR] [--traces DIR] [--recovery-costs FILE]

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/job_file.hpp"
#include "bench/bench_text.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/recovery_costs.hpp"
#include "sim/replay_schedule.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

extern char** environ;

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
namespace sim = oobleck::sim;
namespace planning = oobleck::planning;

using oobleck::bench::fmt;
using oobleck::bench::load_average;

namespace {

double unix_ms_now() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct stamped_line {
  double unix_ms = 0;  ///< when the line arrived
  std::string text;
};

struct program_run {
  int status = -1;
  std::vector<stamped_line> lines;
  std::string transcript() const {
    std::string s;
    for (const auto& l : lines) s += l.text + "\n";
    return s;
  }
  /// The arrival of the first line containing `what` (NaN: none).
  double first(const std::string& what) const {
    for (const auto& l : lines)
      if (l.text.find(what) != std::string::npos) return l.unix_ms;
    return NAN;
  }
};

/// Runs a program to its end (killed after timeout_s), its stdout and stderr stamped line by line.
program_run run_program(const std::string& path, const std::vector<std::string>& args, double timeout_s) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> argv{const_cast<char*>(path.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw std::runtime_error("cannot start " + path + ": " + std::strerror(rc));
  }
  program_run r;
  std::thread watchdog;
  std::atomic<bool> done{false};
  watchdog = std::thread([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) ::kill(pid, SIGTERM);  // oobleck-local stops everything it started
  });
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    const double t = unix_ms_now();
    pending.append(buf, static_cast<std::size_t>(n));
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      r.lines.push_back({t, pending.substr(0, nl)});
      pending.erase(0, nl + 1);
    }
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  done = true;
  watchdog.join();
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// The step lines of a metrics file.
std::vector<nlohmann::json> read_steps(const fs::path& path) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    if (l.empty()) continue;
    auto j = nlohmann::json::parse(l);
    if (!j.contains("event")) steps.push_back(std::move(j));
  }
  return steps;
}

std::vector<nlohmann::json> read_events(const fs::path& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    if (l.empty()) continue;
    auto j = nlohmann::json::parse(l);
    if (j.contains("event")) events.push_back(std::move(j));
  }
  return events;
}

std::string default_job_text(const std::string& bin) {
  const auto r = run_program(bin + "/oobleck-local", {"--print-default-job"}, 60);
  if (r.status != 0) throw std::runtime_error("oobleck-local --print-default-job failed");
  std::string text;
  for (const auto& l : r.lines) text += l.text + "\n";
  return text;
}

void write_trace(const fs::path& path, const std::vector<sim::trace_event>& events) {
  std::ofstream out(path);
  for (const auto& e : events)
    out << static_cast<long long>(std::llround(e.ms)) << "," << (e.action == sim::trace_action::add ? "add" : "remove")
        << "," << e.node << "\n";
}

/// A case: a trace file (a node subset of one of ../shared/traces, written to the scratch folder)
/// replayed on `slots` workers at `scale`.
struct replay_case {
  std::string name;
  std::string source;  ///< the trace it comes from
  std::string how;     ///< how the subset was taken
  fs::path trace;      ///< the file both replay
  int slots = 0;
  double scale = 0;
};

/// 10m.csv (no adds after the start): the first `removed` nodes it removes and `kept` nodes it
/// never removes (file order), ending at the next removal of the trace (which is not replayed).
replay_case ten_minute_case(const fs::path& traces, const fs::path& dir, int removed, int kept, double scale) {
  const auto events = sim::read_trace((traces / "10m.csv").string());
  std::vector<std::string> removal_order;
  std::set<std::string> ever_removed;
  for (const auto& e : events)
    if (e.action == sim::trace_action::remove) {
      removal_order.push_back(e.node);
      ever_removed.insert(e.node);
    }
  if (static_cast<int>(removal_order.size()) <= removed) throw std::runtime_error("10m.csv has too few removals");
  std::set<std::string> subset(removal_order.begin(), removal_order.begin() + removed);
  const std::string end_node = removal_order[static_cast<std::size_t>(removed)];
  int k = 0;
  for (const auto& e : events)
    if (e.action == sim::trace_action::add && !ever_removed.count(e.node) && k < kept && subset.insert(e.node).second) ++k;
  std::vector<sim::trace_event> out;
  double end_ms = 0;
  for (const auto& e : events) {
    if (e.action == sim::trace_action::remove && e.node == end_node) {
      end_ms = e.ms;
      break;
    }
    if (subset.count(e.node)) out.push_back(e);
  }
  // The end: the time of the trace's next removal, marked by an add (any event would do: the run
  // ends at the trace's last time, and what happens then is not replayed, nor simulated).
  out.push_back({end_ms, sim::trace_action::add, "end-of-window", 0});
  replay_case c;
  c.name = "10m.csv subset";
  c.source = (traces / "10m.csv").string();
  c.how = "the first " + std::to_string(removed) + " nodes 10m.csv removes and " + std::to_string(kept) +
          " it never removes (file order); the window ends at its next removal (" + end_node + ", " +
          fmt("%.0f", end_ms / 1000) + " s)";
  c.trace = dir / "10m-subset.csv";
  c.slots = removed + kept;
  c.scale = scale;
  write_trace(c.trace, out);
  return c;
}

/// bamboo-p3-trace.csv up to `until_ms` (its events at or before it), on `slots` workers: the
/// nodes take the slots in the order they are added, later ones wait as spares and join when a
/// slot frees (oobleck-local --trace-nodes).
replay_case bamboo_case(const fs::path& traces, const fs::path& dir, int slots, double until_ms, double scale) {
  const auto events = sim::read_trace((traces / "bamboo-p3-trace.csv").string());
  std::vector<sim::trace_event> out;
  for (const auto& e : events)
    if (e.ms <= until_ms) out.push_back(e);
  replay_case c;
  c.name = "bamboo-p3 (adds as joins)";
  c.source = (traces / "bamboo-p3-trace.csv").string();
  c.how = "its events up to " + fmt("%.0f", out.back().ms / 1000) + " s, on " + std::to_string(slots) +
          " slots (spares join when a slot frees)";
  c.trace = dir / "bamboo-window.csv";
  c.slots = slots;
  c.scale = scale;
  write_trace(c.trace, out);
  return c;
}

/// Mean commit interval (ms) of a failure-free run, its first `skip` steps left out (start-up).
double mean_interval(const std::vector<nlohmann::json>& steps, std::size_t skip) {
  if (steps.size() < skip + 2) return NAN;
  const double a = steps[skip]["unix_ms"].get<double>(), b = steps.back()["unix_ms"].get<double>();
  return (b - a) / static_cast<double>(steps.size() - 1 - skip);
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  std::string json_path, bin = OOBLECK_APPS_DIR, traces_dir = OOBLECK_TRACES_DIR;
  std::string costs_path = std::string(OOBLECK_SOURCE_DIR) + "/bench/results/recovery.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") quick = true;
    else if (a == "--json") json_path = value();
    else if (a == "--bin") bin = value();
    else if (a == "--traces") traces_dir = value();
    else if (a == "--recovery-costs") costs_path = value();
    else {
      std::cout << "usage: sim_validation [--quick] [--json PATH] [--bin DIR] [--traces DIR] [--recovery-costs FILE]\n"
                   "  oobleck-local replays node subsets of the traces (default " OOBLECK_TRACES_DIR ")\n"
                   "  time-scaled; the simulator predicts each replay's average throughput from a profile\n"
                   "  measured here, the recovery costs (default bench/results/recovery.json) and failure-free\n"
                   "  calibration runs (contention per node count, join readiness). --quick: one short case.\n";
      return a == "--help" ? 0 : 2;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  const std::string load_start = load_average();
  std::cout << "simulator validation" << (quick ? " (quick)" : "") << ", load average " << load_start << "\n";
  const fs::path traces = traces_dir;
  if (!fs::exists(traces / "10m.csv")) {
    std::cout << "traces not found in " << traces << ": nothing to validate\n";
    return 0;
  }
  char tmpl[] = "/tmp/oobleck-sim-validation-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a scratch directory");
  const fs::path dir = tmpl;
  struct remove_dir {
    fs::path d;
    ~remove_dir() {
      std::error_code ignored;
      fs::remove_all(d, ignored);
    }
  } cleanup{dir};

  // The job: oobleck-local's default job, planned on a profile measured here.
  std::string job_text = default_job_text(bin) + "\n[profile]\nfile = \"profile.json\"\n";
  const fs::path job_path = dir / "job.toml";
  std::ofstream(job_path) << job_text;
  const auto job = oobleck::apps::parse_job(job_text, "job");
  std::cout << "profiling the default job's model (oobleck-profile) ..." << std::flush;
  const auto prof = run_program(bin + "/oobleck-profile", {"--config", job_path.string(), "--out", (dir / "profile.json").string()}, 300);
  if (prof.status != 0) throw std::runtime_error("oobleck-profile failed:\n" + prof.transcript());
  const auto profile = oobleck::messages::read_profile_file((dir / "profile.json").string());
  std::cout << " done\n";
  const auto costs = sim::read_recovery_costs(costs_path);
  std::cout << "recovery costs: " << costs_path << ": detection " << fmt("%.1f", costs.detection_ms) << " ms, planning "
            << fmt("%.1f", costs.planning_ms) << " ms, copy " << fmt("%.3g", costs.copy_bytes_per_s) << " bytes/s\n";

  std::vector<replay_case> cases;
  if (quick) {
    cases.push_back(ten_minute_case(traces, dir, 2, 4, 0.005));
  } else {
    cases.push_back(ten_minute_case(traces, dir, 4, 4, 0.02));
    // 8 slots: the f = 1 job runs 4 pipelines of 2, so the trace's double removals (3060, 5100 and
    // 8460 s) leave every layer a holder; its triple removal at 10,680 s is beyond the window.
    if (fs::exists(traces / "bamboo-p3-trace.csv")) cases.push_back(bamboo_case(traces, dir, 8, 10000e3, 0.01));
  }
  auto planner_config = [&](int nodes) {
    planning::job_config c;
    c.nodes = nodes;
    c.fault_tolerance = job.cluster.fault_tolerance;
    c.global_batch = job.training.global_batch;
    c.microbatch = job.training.microbatch;
    c.device_memory_bytes = job.cluster.device_memory_bytes;
    return c;
  };
  // The simulated job of a case (step_scale: the contention model, empty for none).
  auto sim_job_for = [&](const replay_case& c, const std::vector<double>& step_scale) {
    sim::sim_job sj;
    sj.profile = profile;
    sj.bamboo_profile = profile;
    sj.nodes = c.slots;
    sj.fault_tolerance = job.cluster.fault_tolerance;
    sj.global_batch = job.training.global_batch;
    sj.microbatch = job.training.microbatch;
    sj.bamboo_microbatch = job.training.microbatch;
    sj.step_scale = step_scale;
    return sj;
  };
  auto cluster_trace_of = [&](const replay_case& c, const sim::replay_schedule& s, double ready_ms) {
    return sim::to_cluster_trace(sim::replay_trace(s),
                                 {.ready_delay_ms = ready_ms, .time_scale = c.scale, .initial_nodes_ready = true});
  };
  // Which node counts the replays train on (the policy's decisions; they do not depend on step
  // times), and whether any has joins: the calibration runs measure those.
  std::set<int> counts;
  int most = 0;
  bool any_joins = false;
  for (const auto& c : cases) {
    most = std::max(most, c.slots);
    const auto s = sim::make_replay_schedule(sim::read_trace(c.trace.string()), {.slots = c.slots});
    for (const auto& e : s.events) any_joins = any_joins || (!e.started.empty() && e.ms < s.end_ms);
    const auto ct = cluster_trace_of(c, s, 0);
    sim::oobleck_policy p(sim_job_for(c, {}), costs, ct.start_ms);
    for (const auto& d : sim::simulate(p, ct, ct.start_ms + s.end_ms * c.scale, c.slots).decisions)
      if (d.nodes_in_use > 0) counts.insert(d.nodes_in_use);
  }

  // --- calibration: failure-free runs, one per node count, before the replays and again after
  // them (the machine is shared: the mean of the two is the figure used, their spread is shown)
  const int calibration_steps = quick ? 25 : 60;
  std::map<int, std::vector<double>> measured_steps;  // nodes -> mean step ms of each pass
  json calibration = json::array();
  auto calibrate = [&](const char* pass) {
    std::cout << "\ncalibration " << pass << " (failure-free runs on the node counts the replays train on, "
              << calibration_steps << " steps each, mean commit interval after step 5):\n";
    std::printf("%6s %12s %12s %10s %12s\n", "nodes", "planned ms", "measured ms", "factor", "load");
    for (int n : counts) {
      const auto metrics = dir / ("calibration-" + std::to_string(n) + ".jsonl");
      const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--nodes", std::to_string(n),
                                                          "--steps", std::to_string(calibration_steps), "--metrics-out",
                                                          metrics.string()},
                                 300);
      if (r.status != 0)
        throw std::runtime_error("calibration run on " + std::to_string(n) + " nodes failed:\n" + r.transcript());
      const double measured = mean_interval(read_steps(metrics), 5);
      const double planned = planning::plan_job(profile, planner_config(n)).step_ms;
      measured_steps[n].push_back(measured);
      const std::string load = load_average();
      std::printf("%6d %12.3f %12.1f %10.1f %12s\n", n, planned, measured, measured / planned, load.c_str());
      calibration.push_back({{"pass", pass}, {"nodes", n}, {"planned_step_ms", planned}, {"measured_step_ms", measured},
                             {"factor", measured / planned}, {"load_average", load}});
    }
  };
  calibrate("before the replays");
  // The readiness delay of a join: a worker started after a commit -> its admission.
  double join_ms = NAN;
  json join_json;
  if (any_joins) {
    const int n = most - 1;
    const auto metrics = dir / "calibration-join.jsonl";
    const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--nodes", std::to_string(n), "--steps",
                                                        "400", "--join-at", "10:1", "--metrics-out", metrics.string()},
                               300);
    if (r.status != 0) throw std::runtime_error("join calibration failed:\n" + r.transcript());
    const double start = r.first("starting 1 more worker"), admitted = r.first("node " + std::to_string(n) + " joined: ");
    join_ms = admitted - start;
    // (With too few steps the job can finish before a slow worker registers: no figure at all.)
    if (!std::isfinite(join_ms)) throw std::runtime_error("join calibration: the worker never joined:\n" + r.transcript());
    const auto events = read_events(metrics);
    std::cout << "join readiness (worker started -> admitted, " << n << " -> " << n + 1 << " nodes): " << fmt("%.0f", join_ms)
              << " ms; the join's own recovery record: "
              << (events.empty() ? std::string("none") : events.front().dump()) << "\n";
    join_json = {{"nodes_before", n}, {"ready_ms", join_ms}, {"records", json::parse(nlohmann::json(events).dump())}};
  }

  // --- the replays (measured)
  struct replay_run {
    sim::replay_schedule schedule;
    double window_ms = 0, t0 = NAN, samples = 0, measured = 0;
    std::size_t replayed_events = 0;  // those before the end (the run ends at the trace's last time)
    std::vector<nlohmann::json> steps, records;
    std::vector<std::string> progress;
    std::string load_before, load_after;
  };
  std::vector<replay_run> runs;
  for (const auto& c : cases) {
    replay_run m;
    m.schedule = sim::make_replay_schedule(sim::read_trace(c.trace.string()), {.slots = c.slots});
    m.window_ms = m.schedule.end_ms * c.scale;
    for (const auto& e : m.schedule.events) m.replayed_events += e.ms < m.schedule.end_ms;
    std::cout << "\n" << c.name << ": " << c.how << "; " << c.slots << " workers, x" << c.scale << " (window "
              << fmt("%.1f", m.window_ms / 1000) << " s)\n";
    for (const auto& e : m.schedule.events)
      if (e.ms < m.schedule.end_ms)
        std::cout << "  " << sim::describe(e) << "  (" << fmt("%.2f", e.ms * c.scale / 1000) << " s here)\n";
    const auto metrics = dir / ("replay-" + std::to_string(runs.size()) + ".jsonl");
    m.load_before = load_average();
    const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--trace", c.trace.string(),
                                                        "--time-scale", fmt("%.17g", c.scale), "--trace-nodes",
                                                        std::to_string(c.slots), "--metrics-out", metrics.string()},
                               m.window_ms / 1000 + 300);
    m.load_after = load_average();
    if (r.status != 0)
      throw std::runtime_error(c.name + ": the replay failed (status " + std::to_string(r.status) + "):\n" + r.transcript());
    for (const auto& l : r.lines)
      if (l.text.rfind("[coordinator] epoch ", 0) == 0 && l.text.find(" formed: ") != std::string::npos) {
        m.t0 = l.unix_ms;
        break;
      }
    if (std::isnan(m.t0)) throw std::runtime_error(c.name + ": no epoch formed:\n" + r.transcript());
    m.steps = read_steps(metrics);
    for (const auto& st : m.steps) {
      const double t = st["unix_ms"].get<double>();
      if (t > m.t0 && t <= m.t0 + m.window_ms) m.samples += st["samples"].get<double>();
    }
    m.measured = m.samples / (m.window_ms / 1000);
    m.records = read_events(metrics);
    for (const auto& l : r.lines)
      if (l.text.rfind("[local] trace ", 0) == 0) m.progress.push_back(l.text);
    std::cout << "  measured " << fmt("%.1f", m.measured) << " samples/s (" << m.samples << " samples in "
              << fmt("%.1f", m.window_ms / 1000) << " s; " << m.records.size() << " recovery record(s); load "
              << m.load_before << " -> " << m.load_after << ")\n";
    runs.push_back(std::move(m));
  }
  calibrate("after the replays");
  std::vector<double> step_scale(static_cast<std::size_t>(most + 1), 0.0);
  std::cout << "\ncontention model (measured / planned step, mean of the two passes):";
  for (const auto& [n, v] : measured_steps) {
    double mean = 0;
    for (double x : v) mean += x / static_cast<double>(v.size());
    step_scale[static_cast<std::size_t>(n)] = mean / planning::plan_job(profile, planner_config(n)).step_ms;
    std::cout << " " << n << " nodes x" << fmt("%.2f", step_scale[static_cast<std::size_t>(n)]) << " ("
              << fmt("%.1f", mean) << " ms)";
  }
  std::cout << "\n";

  // --- the predictions
  json results = json::array();
  std::vector<std::string> table;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const auto& m = runs[i];
    // The same node subset, time scale and readiness delay; the measured costs and contention.
    const auto ct = cluster_trace_of(c, m.schedule, std::isnan(join_ms) ? 0 : join_ms);
    sim::oobleck_policy policy(sim_job_for(c, step_scale), costs, ct.start_ms);
    const auto p = sim::simulate(policy, ct, ct.start_ms + m.window_ms, c.slots);
    // The same without the contention model, for scale.
    sim::oobleck_policy plain(sim_job_for(c, {}), costs, ct.start_ms);
    const auto q = sim::simulate(plain, ct, ct.start_ms + m.window_ms, c.slots);
    const double error = (p.samples_per_s - m.measured) / m.measured;
    std::cout << "\n" << c.name << ": measured " << fmt("%.1f", m.measured) << " samples/s, predicted "
              << fmt("%.1f", p.samples_per_s) << ": error " << fmt("%+.1f", 100 * error)
              << "% (without the contention model: " << fmt("%.0f", q.samples_per_s) << " samples/s)\n";
    for (const auto& d : p.decisions)
      std::cout << "  sim " << fmt("%.2f", (d.ms - ct.start_ms) / 1000) << " s: " << d.what << " on " << d.nodes_in_use
                << " nodes, step " << fmt("%.1f", d.step_ms) << " ms" << (d.detail.empty() ? "" : " (" + d.detail + ")")
                << "\n";
    // Between consecutive events: measured against predicted throughput (where the error comes from).
    std::vector<double> cuts{0};
    for (const auto& e : m.schedule.events)
      if (e.ms < m.schedule.end_ms) cuts.push_back(e.ms * c.scale);
    cuts.push_back(m.window_ms);
    json phases = json::array();
    std::cout << "  phase (s here)      measured/s  predicted/s\n";
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      const double a = cuts[k], b = cuts[k + 1];
      if (!(b > a)) continue;
      double got = 0, want = 0;
      for (const auto& st : m.steps) {
        const double t = st["unix_ms"].get<double>() - m.t0;
        if (t > a && t <= b) got += st["samples"].get<double>();
      }
      for (const auto& seg : p.segments) {
        const double lo = std::max(a, seg.start_ms - ct.start_ms), hi = std::min(b, seg.end_ms - ct.start_ms);
        if (hi > lo && seg.end_ms > seg.start_ms) want += seg.samples * (hi - lo) / (seg.end_ms - seg.start_ms);
      }
      const double span_s = (b - a) / 1000;
      std::printf("  %6.1f - %6.1f %13.1f %12.1f\n", a / 1000, b / 1000, got / span_s, want / span_s);
      phases.push_back({{"from_s", a / 1000}, {"to_s", b / 1000}, {"measured_samples_per_s", got / span_s},
                        {"predicted_samples_per_s", want / span_s}});
    }
    char row[256];
    std::snprintf(row, sizeof row, "%-28s %6d %8g %9.1f %7zu %11.1f %11.1f %+8.1f%%", c.name.c_str(), c.slots, c.scale,
                  m.window_ms / 1000, m.replayed_events, m.measured, p.samples_per_s, 100 * error);
    table.push_back(row);
    json breakdown;
    for (int a = 0; a < sim::kActivities; ++a)
      breakdown[sim::to_string(static_cast<sim::activity>(a))] = p.breakdown_ms[static_cast<std::size_t>(a)];
    json recs = json::array();
    for (const auto& e : m.records) recs.push_back(json::parse(e.dump()));
    results.push_back({{"case", c.name},
                       {"source", c.source},
                       {"subset", c.how},
                       {"slots", c.slots},
                       {"time_scale", c.scale},
                       {"window_s", m.window_ms / 1000},
                       {"events", m.replayed_events},
                       {"replayed", m.progress},
                       {"measured_samples_per_s", m.measured},
                       {"measured_samples", m.samples},
                       {"recovery_records", recs},
                       {"predicted_samples_per_s", p.samples_per_s},
                       {"relative_error", error},
                       {"predicted_without_contention_model", q.samples_per_s},
                       {"predicted_breakdown_ms", breakdown},
                       {"phases", phases},
                       {"load_average", {m.load_before, m.load_after}}});
  }
  json model = json::object();
  for (std::size_t n = 0; n < step_scale.size(); ++n)
    if (step_scale[n] > 0) model[std::to_string(n)] = step_scale[n];
  std::cout << "\n";
  std::printf("%-28s %6s %8s %9s %7s %11s %11s %9s\n", "case", "nodes", "scale", "window s", "events", "measured/s",
              "predicted/s", "error");
  int within = 0;
  for (const auto& row : table) std::cout << row << "\n";
  for (const auto& r : results) within += std::abs(r["relative_error"].get<double>()) <= 0.10;
  std::cout << "within 10%: " << within << " of " << results.size() << " case(s) (target: at least 2)\n";
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "total " << fmt("%.0f", total_s) << " s, load average " << load_average() << "\n";
  if (!json_path.empty()) {
    json out;
    out["quick"] = quick;
    out["method"] =
        "oobleck-local --trace replays a node subset time-scaled; measured = committed samples (metrics unix_ms) in "
        "[first epoch formed, + window] / window; predicted = sim::oobleck_policy on the same subset "
        "(sim::replay_trace), profile from oobleck-profile here, recovery costs from the file, step time x "
        "measured/planned per node count from failure-free calibration runs, join readiness from a --join-at run";
    out["recovery_costs"] = costs_path;
    out["profile_step_ms_6_nodes"] = planning::plan_job(profile, planner_config(6)).step_ms;
    out["calibration"] = calibration;
    out["step_scale_by_nodes"] = model;
    out["join"] = join_json;
    out["cases"] = results;
    out["within_10_percent"] = within;
    out["load_average"] = {{"start", load_start}, {"end", load_average()}};
    out["total_s"] = total_s;
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
