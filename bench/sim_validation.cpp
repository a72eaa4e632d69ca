// Issue 9's validation: does oobleck-sim predict what the local cluster does under a trace?
//
// For each case, oobleck-local replays a node availability trace on this machine
// (`--trace FILE --time-scale X --trace-nodes N`: removals are kill -9 of workers, later adds
// start workers that join) and its average throughput is measured: committed samples per second
// over the replay window (the first epoch formed, its job event's unix_ms -> the trace's last time
// scaled), counted from the --metrics-out step lines (their unix_ms, the same clock). What the job
// did is read from oobleck-local's --events-out (the coordinator's job events), never from its log
// lines. The simulator (sim/ library: the same planner, the
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
//   - the readiness delay of a join: measured in a separate calibration run (--join-at 10:1), from
//     the commit of step 10 (which makes oobleck-local start the worker within its 50 ms poll, as a
//     trace replay starts a joining worker once its add is due) to the worker's admission (its
//     node_joined event), not the 45 s of the cloud simulators.
// Nothing is fitted to the replay being predicted: every input comes from runs before it.
//
// A case may replay with an f of its own (the mass-preemption case: f = 2, so that the trace's triple
// removal leaves fewer than (f + 1) n0 nodes and the job waits for nodes, then resumes by itself);
// its calibration runs use the same f.
//
// usage: sim_validation [--quick] [--case TEXT] [--json PATH] [--bin DIR] [--traces DIR] [--recovery-costs FILE]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_events.hpp"
#include "bench/job_toml.hpp"
#include "bench/sim_validation_cases.hpp"
#include "bench/sim_validation_predict.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/recovery_costs.hpp"
#include "sim/replay_schedule.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
namespace sim = oobleck::sim;
namespace planning = oobleck::planning;

using namespace oobleck::bench;

namespace {

/// The step lines of a metrics file.
std::vector<nlohmann::json> read_steps(const fs::path& path) { return read_metrics(path).steps; }

/// The "reconfigured" (and other non-step) records of a metrics file.
std::vector<nlohmann::json> read_records(const fs::path& path) { return read_metrics(path).events; }

/// Mean commit interval (ms) of a failure-free run, its first `skip` steps left out (start-up).
double mean_interval(const std::vector<nlohmann::json>& steps, std::size_t skip) {
  if (steps.size() < skip + 2) return NAN;
  const double a = steps[skip]["unix_ms"].get<double>(), b = steps.back()["unix_ms"].get<double>();
  return (b - a) / static_cast<double>(steps.size() - 1 - skip);
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  std::string only;
  std::string json_path, bin = OOBLECK_APPS_DIR, traces_dir = OOBLECK_TRACES_DIR;
  std::string costs_path = std::string(OOBLECK_SOURCE_DIR) + "/bench/results/recovery.json";
  oobleck::bench::flag_set app{
      "sim_validation: oobleck-local replays node subsets of the traces time-scaled; the simulator predicts\n"
      "each replay's average throughput from a profile measured here, the recovery costs and failure-free\n"
      "calibration runs (contention per node count, join readiness).",
      "sim_validation"};
  app.add_switch("--quick", quick, "one short case (a smoke run)");
  app.add_text("--case", only, "only the cases whose name contains TEXT (e.g. 'mass')").type_name("TEXT");
  app.add_text("--json", json_path, "write every figure to PATH");
  app.add_text("--bin", bin,
               "the folder of oobleck-local, oobleck-profile and the cluster programs (default: the build's)");
  app.add_text("--traces", traces_dir,
               "the folder of the node availability traces (default " OOBLECK_TRACES_DIR
               "); without them --quick replays a synthetic trace of its own");
  app.add_text("--recovery-costs", costs_path,
               "the recovery costs the simulator uses (default bench/results/recovery.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  const auto started = std::chrono::steady_clock::now();
  const std::string load_start = load_average();
  std::cout << "simulator validation" << (quick ? " (quick)" : "") << ", load average " << load_start << "\n";
  const fs::path traces = traces_dir;
  // Without the traces a smoke run replays a trace of its own; a full run needs them.
  const bool have_traces = fs::exists(traces / "10m.csv");
  if (!have_traces && !quick) {
    std::cerr << "error: no 10m.csv in " << traces << " (the node availability traces): give --traces DIR\n";
    return 2;
  }
  if (!have_traces) std::cout << "traces not found in " << traces << ": the quick case replays a synthetic trace\n";
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
  const std::string job_text = with_keys(default_job_text(bin), {{"profile", "file", "profile.json"}});
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
  const validation_job validated{job, profile, costs};

  std::vector<replay_case> cases;
  if (quick) {
    cases.push_back(have_traces ? ten_minute_case(traces, dir, 2, 4, 0.005) : synthetic_case(dir, 0.005));
  } else {
    cases.push_back(ten_minute_case(traces, dir, 4, 4, 0.02));
    // 8 slots: the f = 1 job runs 4 pipelines of 2, so the trace's double removals (3060, 5100 and
    // 8460 s) leave every layer a holder; its triple removal at 10,680 s is beyond the window.
    if (fs::exists(traces / "bamboo-p3-trace.csv")) cases.push_back(bamboo_case(traces, dir, 8, 10000e3, 0.01));
    // Simultaneous removals beyond f (issue 25, item 7): from 4,000 s to 11,520 s, 8 slots at f = 2
    // ((f + 1) n0 = 6 nodes): two single and two double removals the job goes through, then the
    // triple removal at 10,680 s leaves 5 nodes: the coordinator waits for the spares the trace
    // starts at once, and resumes when they have joined.
    if (fs::exists(traces / "bamboo-p3-trace.csv"))
      cases.push_back(bamboo_window_case(traces, dir, 8, 4000e3, 11520e3, 0.01, 2));
  }
  if (!only.empty()) {
    std::erase_if(cases, [&](const replay_case& c) { return c.name.find(only) == std::string::npos; });
    if (cases.empty()) throw std::runtime_error("--case " + only + ": no case has that in its name");
  }
  // Which node counts the replays train on, with which f (the policy's decisions; they do not
  // depend on step times), and whether any has joins: the calibration runs measure those.
  std::set<std::pair<int, int>> counts;  // (f, nodes)
  int most = 0;
  bool any_joins = false;
  for (const auto& c : cases) {
    most = std::max(most, c.slots);
    const auto s = sim::make_replay_schedule(sim::read_trace(c.trace.string()), {.slots = c.slots});
    for (const auto& e : s.events) any_joins = any_joins || (!e.started.empty() && e.ms < s.end_ms);
    // A started worker trains only once it has joined, so the cluster shrinks first: with joins
    // ready at the removals' time, a removal and the join replacing it would be one change and
    // the counts between them (7 of 8 nodes, ...) never seen. The join readiness is measured
    // later; the counts do not depend on it beyond whether changes overlap, so a few delays.
    for (double ready_ms : {1.0, 1000.0, 3000.0}) {
      const auto ct = cluster_trace_of(c, s, ready_ms);
      sim::oobleck_policy p(validated.sim_job_for(c, {}), costs, ct.start_ms);
      for (const auto& d : sim::simulate(p, ct, ct.start_ms + s.end_ms * c.scale, c.slots).decisions)
        if (d.nodes_in_use > 0) counts.insert({validated.fault_tolerance(c), d.nodes_in_use});
    }
  }

  // --- calibration: failure-free runs, one per node count, before the replays and again after
  // them (the machine is shared: the mean of the two is the figure used, their spread is shown)
  const int calibration_steps = quick ? 25 : 60;
  std::map<std::pair<int, int>, std::vector<double>> measured_steps;  // (f, nodes) -> mean step ms of each pass
  json calibration = json::array();
  auto calibrate = [&](const char* pass) {
    std::cout << "\ncalibration " << pass << " (failure-free runs on the node counts the replays train on, "
              << calibration_steps << " steps each, mean commit interval after step 5):\n";
    std::printf("%3s %6s %12s %12s %10s %12s\n", "f", "nodes", "planned ms", "measured ms", "factor", "load");
    for (const auto& [f, n] : counts) {
      const auto metrics = dir / ("calibration-" + std::to_string(f) + "-" + std::to_string(n) + ".jsonl");
      const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--nodes", std::to_string(n),
                                                          "--fault-tolerance", std::to_string(f), "--steps",
                                                          std::to_string(calibration_steps), "--metrics-out",
                                                          metrics.string()},
                                 300);
      if (r.status != 0)
        throw std::runtime_error("calibration run on " + std::to_string(n) + " nodes failed:\n" + r.transcript());
      const double measured = mean_interval(read_steps(metrics), 5);
      const double planned = planning::plan_job(profile, validated.planner_config(n, f)).step_ms;
      measured_steps[{f, n}].push_back(measured);
      const std::string load = load_average();
      std::printf("%3d %6d %12.3f %12.1f %10.1f %12s\n", f, n, planned, measured, measured / planned, load.c_str());
      calibration.push_back({{"pass", pass}, {"fault_tolerance", f}, {"nodes", n}, {"planned_step_ms", planned},
                             {"measured_step_ms", measured}, {"factor", measured / planned}, {"load_average", load}});
    }
  };
  calibrate("before the replays");
  // The readiness delay of a join: a worker started after a commit -> its admission.
  double join_ms = NAN;
  json join_json;
  if (any_joins) {
    const int n = most - 1;
    const auto metrics = dir / "calibration-join.jsonl";
    const auto events_path = dir / "calibration-join-events.jsonl";
    const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--nodes", std::to_string(n), "--steps",
                                                        "400", "--join-at", "10:1", "--metrics-out", metrics.string(),
                                                        "--events-out", events_path.string()},
                               300);
    if (r.status != 0) throw std::runtime_error("join calibration failed:\n" + r.transcript());
    // From the commit of step 10, which makes oobleck-local start the worker (within its 50 ms
    // poll, as a trace replay starts a joining worker when its add is due), to the worker's
    // admission: both job events, unix_ms of the coordinator's clock.
    double start = NAN, admitted = NAN;
    for (const auto& e : oobleck::bench::read_events(events_path)) {
      if (e.event.kind == event_kind::step_committed && e.event.step == 10 && std::isnan(start)) start = e.unix_ms;
      if (e.event.kind == event_kind::node_joined && e.event.node == n && std::isnan(admitted)) admitted = e.unix_ms;
    }
    join_ms = admitted - start;
    // (With too few steps the job can finish before a slow worker registers: no figure at all.)
    if (!std::isfinite(join_ms)) throw std::runtime_error("join calibration: the worker never joined:\n" + r.transcript());
    const auto events = read_records(metrics);
    std::cout << "join readiness (step 10 committed, worker started -> admitted, " << n << " -> " << n + 1 << " nodes): " << fmt("%.0f", join_ms)
              << " ms; the join's own recovery record: "
              << (events.empty() ? std::string("none") : events.front().dump()) << "\n";
    join_json = {{"nodes_before", n},
                 {"ready_ms", join_ms},
                 {"ready_from", "the step_committed event of the --join-at step -> the node_joined event"},
                 {"records", json::parse(nlohmann::json(events).dump())}};
  }

  // --- the replays (measured)
  std::vector<measured_replay> runs;
  for (const auto& c : cases) {
    measured_replay m;
    m.schedule = sim::make_replay_schedule(sim::read_trace(c.trace.string()), {.slots = c.slots});
    m.window_ms = m.schedule.end_ms * c.scale;
    for (const auto& e : m.schedule.events) m.replayed_events += e.ms < m.schedule.end_ms;
    std::cout << "\n" << c.name << ": " << c.how << "; " << c.slots << " workers, x" << c.scale << " (window "
              << fmt("%.1f", m.window_ms / 1000) << " s)\n";
    for (const auto& e : m.schedule.events)
      if (e.ms < m.schedule.end_ms)
        std::cout << "  " << sim::describe(e) << "  (" << fmt("%.2f", e.ms * c.scale / 1000) << " s here)\n";
    try {
    const auto metrics = dir / ("replay-" + std::to_string(runs.size()) + ".jsonl");
    const auto events_path = dir / ("replay-" + std::to_string(runs.size()) + "-events.jsonl");
    m.load_before = load_average();
    const auto r = run_program(bin + "/oobleck-local", {"--config", job_path.string(), "--trace", c.trace.string(),
                                                        "--time-scale", fmt("%.17g", c.scale), "--trace-nodes",
                                                        std::to_string(c.slots), "--fault-tolerance",
                                                        std::to_string(validated.fault_tolerance(c)), "--metrics-out",
                                                        metrics.string(), "--events-out", events_path.string()},
                               m.window_ms / 1000 + 300);
    m.load_after = load_average();
    if (r.status != 0)
      throw std::runtime_error(c.name + ": the replay failed (status " + std::to_string(r.status) + "):\n" + r.transcript());
    // The window starts when the first epoch formed (its event's unix_ms, the clock of the metrics).
    const auto events = oobleck::bench::read_events(events_path);
    for (const auto& e : events)
      if (e.event.kind == event_kind::epoch_formed) {
        m.t0 = e.unix_ms;
        break;
      }
    if (std::isnan(m.t0)) throw std::runtime_error(c.name + ": no epoch formed:\n" + r.transcript());
    m.steps = read_steps(metrics);
    for (const auto& st : m.steps) {
      const double t = st["unix_ms"].get<double>();
      if (t > m.t0 && t <= m.t0 + m.window_ms) m.samples += st["samples"].get<double>();
    }
    m.measured = m.samples / (m.window_ms / 1000);
    m.records = read_records(metrics);
    // The coordinator's waits below the minimum and its resumes (issue 25, item 6); a wait writes a
    // waiting_for_nodes record each time its node count changes.
    bool waiting = false;
    for (const auto& rec : m.records) {
      const auto what = rec.value("event", std::string());
      if (what == "waiting_for_nodes" && !waiting) {
        ++m.waits;
        waiting = true;
      }
      if (what == "resumed") {
        ++m.resumes;
        m.waited_ms += rec.value("waited_ms", 0.0);
        waiting = false;
      }
    }
    // What the replay did, for people: the job's losses, joins, epochs, waits and resumes from the
    // window's start.
    for (const auto& e : events)
      if (e.unix_ms >= m.t0 && (e.event.kind == event_kind::node_lost || e.event.kind == event_kind::node_joined ||
                                e.event.kind == event_kind::epoch_formed || e.event.kind == event_kind::stopped ||
                                e.event.kind == event_kind::waiting_for_nodes || e.event.kind == event_kind::resumed))
        m.progress.push_back(fmt("%.2f s: ", (e.unix_ms - m.t0) / 1000) + describe(e));
    std::cout << "  measured " << fmt("%.1f", m.measured) << " samples/s (" << m.samples << " samples in "
              << fmt("%.1f", m.window_ms / 1000) << " s; " << m.records.size() << " recovery record(s); load "
              << m.load_before << " -> " << m.load_after << ")\n";
    } catch (const std::exception& e) {
      // This case failed (e.g. a replay the job could not go through); the others still run.
      m.failure = e.what();
      std::cout << "  FAILED: " << m.failure.substr(0, m.failure.find('\n')) << "\n";
    }
    runs.push_back(std::move(m));
  }
  calibrate("after the replays");
  std::map<int, std::vector<double>> step_scale;  // f -> by node count
  std::cout << "\ncontention model (measured / planned step, mean of the two passes):";
  for (const auto& [key, v] : measured_steps) {
    const auto [f, n] = key;
    double mean = 0;
    for (double x : v) mean += x / static_cast<double>(v.size());
    auto& scale = step_scale[f];
    scale.resize(static_cast<std::size_t>(most + 1), 0.0);
    scale[static_cast<std::size_t>(n)] = mean / planning::plan_job(profile, validated.planner_config(n, f)).step_ms;
    std::cout << " f=" << f << " " << n << " nodes x" << fmt("%.2f", scale[static_cast<std::size_t>(n)]) << " ("
              << fmt("%.1f", mean) << " ms)";
  }
  std::cout << "\n";

  // --- the predictions
  json results = json::array();
  std::vector<std::string> table;
  int failed = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::string row;
    if (!runs[i].failure.empty()) {
      ++failed;
      results.push_back({{"case", cases[i].name}, {"failed", runs[i].failure}});
      std::string name = cases[i].name;
      name.resize(std::max<std::size_t>(name.size(), 28), ' ');
      table.push_back(name + " FAILED: " + runs[i].failure.substr(0, runs[i].failure.find('\n')));
      continue;
    }
    results.push_back(
        predict_case(validated, cases[i], runs[i], step_scale[validated.fault_tolerance(cases[i])], join_ms, row));
    table.push_back(row);
  }
  json model = json::object(), model_by_f = json::object();
  for (const auto& [f, scale] : step_scale) {
    json by_nodes = json::object();
    for (std::size_t n = 0; n < scale.size(); ++n)
      if (scale[n] > 0) by_nodes[std::to_string(n)] = scale[n];
    if (f == job.cluster.fault_tolerance) model = by_nodes;
    model_by_f[std::to_string(f)] = by_nodes;
  }
  std::cout << "\n";
  std::printf("%-28s %6s %8s %9s %7s %11s %11s %9s\n", "case", "nodes", "scale", "window s", "events", "measured/s",
              "predicted/s", "error");
  int within = 0;
  for (const auto& row : table) std::cout << row << "\n";
  for (const auto& r : results)
    if (r.contains("relative_error")) within += std::abs(r["relative_error"].get<double>()) <= 0.10;
  std::cout << "within 10%: " << within << " of " << results.size() << " case(s) (target: at least 2)";
  if (failed > 0) std::cout << "; " << failed << " case(s) FAILED";
  std::cout << "\n";
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
    out["profile_step_ms_6_nodes"] =
        planning::plan_job(profile, validated.planner_config(6, job.cluster.fault_tolerance)).step_ms;
    out["calibration"] = calibration;
    out["step_scale_by_nodes"] = model;
    out["step_scale_by_fault_tolerance"] = model_by_f;
    out["join"] = join_json;
    out["cases"] = results;
    out["within_10_percent"] = within;
    out["failed_cases"] = failed;
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
