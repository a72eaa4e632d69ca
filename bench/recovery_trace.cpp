#include "bench/recovery_trace.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "bench/bench_text.hpp"
#include "bench/job_toml.hpp"
#include "bench/recovery_cluster.hpp"
#include "bench/recovery_plan.hpp"
#include "runtime/child_process.hpp"
#include "sim/replay_schedule.hpp"
#include "sim/report.hpp"
#include "sim/trace.hpp"

namespace fs = std::filesystem;

namespace oobleck::bench {

namespace {

struct replay_kill {
  double trace_ms = 0;
  std::vector<std::string> names;
  std::vector<int> nodes;
};

struct replay_run {
  std::vector<double> commit_s;  ///< commit times after the first epoch formed
  int samples_per_step = 0;
  std::vector<double> kill_s;
  std::vector<nlohmann::json> events;
  int status = 0;
};

replay_run run_replay(const std::string& bin, const std::string& job_text, int nodes, double window_s,
                      const std::vector<replay_kill>& kills, double scale, int samples_per_step) {
  // Stopped by SIGTERM at the window's end; the step count only bounds how long the job would
  // outlive a benchmark killed from outside (steps here take tens of ms, never 5).
  const auto max_steps = static_cast<std::int64_t>(std::max(1000.0, window_s * 200));
  local_cluster c({bin, job_text, nodes, max_steps, 1000, 10000});
  replay_run run;
  run.samples_per_step = samples_per_step;
  // Times are unix_ms: the coordinator's events carry the system clock of when it published them.
  const auto formed =
      c.wait_for([](const timed_event& e) { return e.event.kind == event_kind::epoch_formed && e.event.epoch == 1; }, 0, 120);
  if (!formed) {
    c.keep_files();
    throw std::runtime_error("trace replay: the first epoch never formed\n" + c.transcript());
  }
  const double t0 = c.events()[*formed].unix_ms;
  for (const auto& k : kills) {
    sleep_until_unix_ms(t0 + k.trace_ms * scale);
    for (int n : k.nodes) run.kill_s.push_back((c.signal(n, SIGKILL) - t0) / 1000);
  }
  sleep_until_unix_ms(t0 + window_s * 1000);
  const double end = unix_ms_now();
  run.status = c.stop();
  c.events().read();
  for (const auto& e : c.events().events())
    if (e.event.kind == event_kind::step_committed && e.unix_ms <= end) run.commit_s.push_back((e.unix_ms - t0) / 1000);
  std::vector<nlohmann::json> steps;
  c.read_metrics(steps, run.events);
  return run;
}

std::vector<double> throughput_series(const replay_run& r, double window_s, double bin_s) {
  std::vector<double> s(static_cast<std::size_t>(std::ceil(window_s / bin_s)), 0.0);
  for (double t : r.commit_s) {
    const auto i = static_cast<std::size_t>(t / bin_s);
    if (i < s.size()) s[i] += r.samples_per_step;
  }
  for (std::size_t i = 0; i < s.size(); ++i) s[i] /= std::min(bin_s, window_s - i * bin_s);  // the last bin may be short
  return s;
}

void plot_replay(const std::string& png, const std::string& title, double bin_s, const std::vector<double>& free_run,
                 const std::vector<double>& replay, const std::vector<double>& kills, double free_avg, double replay_avg,
                 std::size_t) {
  const std::string gnuplot = sim::find_gnuplot();
  if (gnuplot.empty()) {
    std::cout << "gnuplot is not on PATH: no plot (Debian: apt-get install gnuplot-nox)\n";
    return;
  }
  const fs::path dir = fs::temp_directory_path() / ("oobleck-bench-recovery-plot-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "series.dat");
    for (std::size_t i = 0; i < free_run.size() && i < replay.size(); ++i)
      f << (i + 0.5) * bin_s << " " << free_run[i] << " " << replay[i] << "\n";  // bin centres
  }
  {
    std::ofstream f(dir / "plot.gp");
    f << "set terminal pngcairo size 1000,500 noenhanced\n";
    f << "set output '" << png << "'\n";
    f << "set title '" << title << "'\n";
    f << "set xlabel 'time since the first epoch formed (s, local)'\nset ylabel 'throughput (samples/s)'\n";
    f << "set xrange [0:" << free_run.size() * bin_s << "]\nset yrange [0:*]\nset grid\nset key bottom left\n";
    for (double k : kills) f << "set arrow from " << k << ", graph 0 to " << k << ", graph 1 nohead dt 2 lc rgb 'red'\n";
    f << "plot '" << (dir / "series.dat").string() << "' using 1:2 with lines lw 2 title 'failure-free ("
      << fmt("%.1f", free_avg) << " samples/s)', '' using 1:3 with lines lw 2 title 'trace removals as kills ("
      << fmt("%.1f", replay_avg) << " samples/s; red: kills)'\n";
  }
  // gnuplot's messages go to our stdout, as its output would.
  const int rc = runtime::child_process(gnuplot, {(dir / "plot.gp").string()}, {.err = runtime::child_output::descriptor(1)}).wait();
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  if (rc != 0) throw std::runtime_error("gnuplot failed (status " + std::to_string(rc) + ")");
  std::cout << "plot: " << png << "\n";
}

}  // namespace

json run_trace_replay(const trace_replay_options& o) {
  const std::string &bin = o.bin, &trace_path = o.trace_path, &plot_path = o.plot_path;
  const double time_scale = o.time_scale;
  const bool quick = o.quick;
  if (!fs::exists(trace_path)) {
    std::cout << "\ntrace replay: " << trace_path << " not found: skipped\n";
    return {{"trace", trace_path}, {"skipped", "trace not found"}};
  }
  const auto events = sim::read_trace(trace_path);
  const int nodes = 8;
  // The trace's first 8 starting nodes (file order) and their removals (sim/replay_schedule.hpp,
  // as oobleck-local --trace schedules them, without the joins).
  const auto schedule = sim::make_replay_schedule(events, {.slots = nodes, .joins = false});
  const std::vector<std::string>& sample = schedule.initial;
  const std::string replay_job = with_keys(o.job_text, {{"cluster", "nodes", nodes}});
  const job_model model(replay_job, nodes);
  plan_replay planner(model);
  std::vector<replay_kill> kills;
  double end_trace_ms = schedule.end_ms;
  std::string end_reason = "the trace's end";
  const int adds_ignored = schedule.adds_without_slot, removes_elsewhere = schedule.removes_without_worker;
  for (const auto& e : schedule.events) {
    const replay_kill k{e.ms, e.removed, e.killed};
    const auto r = planner.lose(planning::node_ids(k.nodes));
    if (r.action == planning::reconfiguration_action::checkpoint_and_stop) {
      end_trace_ms = e.ms;
      std::string names;
      for (const auto& n : k.names) names += " " + n;
      end_reason = "the removal of" + names + " at " + fmt("%.0f", e.ms / 1000) + " s, which the job cannot survive (" +
                   r.reason + ")";
      break;
    }
    kills.push_back(k);
  }
  const double window_s = end_trace_ms * time_scale / 1000;
  std::cout << "\ntrace replay: " << trace_path << ", nodes";
  for (std::size_t i = 0; i < sample.size(); ++i) std::cout << " " << sample[i] << "->" << i;
  std::cout << "; time scale " << time_scale << "; window " << fmt("%.0f", end_trace_ms / 1000) << " s of trace = "
            << fmt("%.1f", window_s) << " s, ending at " << end_reason << "\n";
  for (const auto& k : kills) {
    std::cout << "  kill at trace " << fmt("%.0f", k.trace_ms / 1000) << " s (local " << fmt("%.2f", k.trace_ms * time_scale / 1000)
              << " s):";
    for (std::size_t j = 0; j < k.nodes.size(); ++j) std::cout << " " << k.names[j] << " (node " << k.nodes[j] << ")";
    std::cout << "\n";
  }
  const int spb = model.job.training.global_batch;
  // Failure-free and replay runs alternate (A B B A in the full run) so that a change of the
  // machine's load from other work weighs on both alike.
  const std::vector<bool> order = quick ? std::vector<bool>{false, true} : std::vector<bool>{false, true, true, false};
  std::vector<replay_run> free_runs, replays;
  for (bool with_kills : order) {
    std::cout << (with_kills ? "  replay ..." : "  failure-free run ...") << std::flush;
    auto r = run_replay(bin, replay_job, nodes, window_s, with_kills ? kills : std::vector<replay_kill>{}, time_scale, spb);
    std::cout << " " << r.commit_s.size() << " steps, load " << load_average() << "\n";
    (with_kills ? replays : free_runs).push_back(std::move(r));
  }
  const double bin_s = quick ? 0.25 : 1.0;
  auto mean_series = [&](const std::vector<replay_run>& runs) {
    std::vector<double> m;
    for (const auto& r : runs) {
      const auto s = throughput_series(r, window_s, bin_s);
      if (m.empty()) m.assign(s.size(), 0.0);
      for (std::size_t i = 0; i < s.size(); ++i) m[i] += s[i] / runs.size();
    }
    return m;
  };
  auto averages = [&](const std::vector<replay_run>& runs) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r.commit_s.size() * spb / window_s);
    return v;
  };
  const auto free_avgs = averages(free_runs), replay_avgs = averages(replays);
  double free_avg = 0, replay_avg = 0;
  for (double x : free_avgs) free_avg += x / free_avgs.size();
  for (double x : replay_avgs) replay_avg += x / replay_avgs.size();
  const auto free_series = mean_series(free_runs);
  const auto replay_series = mean_series(replays);
  const auto& replay = replays.front();
  // What the recoveries themselves cost: time from each last commit before a loss to the first
  // commit after it, less one step, as a share of the window.
  std::vector<double> free_steps;
  for (const auto& r : free_runs)
    for (std::size_t i = 1; i < r.commit_s.size(); ++i) free_steps.push_back((r.commit_s[i] - r.commit_s[i - 1]) * 1000);
  const double free_step_ms = median(free_steps);
  std::vector<double> lost_shares;
  json recs = json::array();
  for (const auto& r : replays) {
    double lost_ms = 0;
    json one = json::array();
    for (const auto& e : r.events) {
      lost_ms += std::max(0.0, e["downtime_ms"].get<double>() - free_step_ms);
      one.push_back(json::parse(e.dump()));
    }
    recs.push_back(one);
    lost_shares.push_back(lost_ms / 1000 / window_s);
  }
  std::cout << "  average throughput: failure-free " << fmt("%.1f", free_avg) << " samples/s, replay "
            << fmt("%.1f", replay_avg) << " samples/s: " << fmt("%.3f", replay_avg / free_avg)
            << " of the failure-free run (" << kills.size() << " removal event(s) replayed; " << adds_ignored
            << " nodes of the trace outside the sample, their adds not replayed here (oobleck-local --trace and "
               "bench/sim_validation replay joins); "
            << removes_elsewhere << " removals of nodes outside the sample)\n"
            << "  recoveries (downtime less one failure-free step of " << fmt("%.1f", free_step_ms)
            << " ms) took " << fmt("%.2f", 100 * median(lost_shares)) << "% of the window\n";
  if (!plot_path.empty())
    plot_replay(plot_path,
                "default job, " + std::to_string(nodes) + " local nodes: " + fs::path(trace_path).filename().string() +
                    " removals x" + fmt("%g", time_scale) + ", mean of " + std::to_string(replays.size()) +
                    " run(s) each (" + fmt("%.3f", replay_avg / free_avg) + " of failure-free)",
                bin_s, free_series, replay_series, replay.kill_s, free_avg, replay_avg, replays.size());
  json ks = json::array();
  for (const auto& k : kills) ks.push_back({{"trace_s", k.trace_ms / 1000}, {"names", k.names}, {"nodes", k.nodes}});
  return json{{"trace", trace_path},
               {"nodes", nodes},
               {"sample", sample},
               {"time_scale", time_scale},
               {"window_trace_s", end_trace_ms / 1000},
               {"window_s", window_s},
               {"ends_at", end_reason},
               {"kills", ks},
               {"kill_local_s", replay.kill_s},
               {"adds_not_replayed", adds_ignored},
               {"removals_outside_sample", removes_elsewhere},
               {"failure_free_samples_per_s", free_avg},
               {"replay_samples_per_s", replay_avg},
               {"relative_throughput", replay_avg / free_avg},
               {"failure_free_runs_samples_per_s", free_avgs},
               {"replay_runs_samples_per_s", replay_avgs},
               {"failure_free_step_ms", free_step_ms},
               {"recovery_share_of_window", lost_shares},
               {"reconfigured_per_replay", recs},
               {"bin_s", bin_s},
               {"failure_free_series", free_series},
               {"replay_series", replay_series}};
}

}  // namespace oobleck::bench
