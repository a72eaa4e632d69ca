// Issue 8's recovery benchmark: what a lost node costs on the local cluster, for a crash (SIGKILL)
// and for a hang (SIGSTOP), and a time-scaled replay of a spot-instance trace; and what a lost
// coordinator costs (issue 25).
//
// The benchmark starts the processes itself (one oobleck-coordinator, N oobleck-worker, as
// tests/actors/local_training_e2e_test.cpp's fencing test does) so that it knows when a fault
// happens. It learns what the job does from the coordinator's job events (--events-out, read as
// the file grows; never its log lines) and sends SIGKILL / SIGSTOP to a worker itself half a
// failure-free step after a step_committed event. Every time is on one clock, the system clock
// of this machine in unix ms: the events' unix_ms (when the coordinator published them) against
// the clock read just before the signal:
//   detection   = fault -> the coordinator's first failure notice (a node_lost event, or a
//                 step_failed one that it answers by forming the epoch again, when the data plane
//                 saw the crash first); the faulted node's node_lost is reported too;
//   resume      = fault -> the step_committed event of the first step after it;
//   downtime    = the coordinator's own figure (last commit before the failure -> first commit
//                 after), and the same in failure-free steps;
// and from the coordinator's "reconfigured" metrics record: the decision (plan_ms), the bytes the
// copy plan moved, copy_ms (the slowest node's layer copies: post the buffers, receive and
// install), connect_ms and views_ms (its new mesh and stage views) and form_ms (assignments sent ->
// every node ready: all of those and the messages). The copy bandwidth is the busiest link's bytes
// over copy_ms, and every link's bytes over copy_ms beside it (on one machine the links share its cores);
// each against the host transport's p2p bandwidth for one message of the busiest link's bytes,
// measured in the same run (4 MiB messages stay in this VM's L3, 16 MiB do not). The target is
// judged apart for the events where every worker left has a core of its own (the xl model on 3
// nodes: 2 survivors on this machine's 2 cores, as each node has its own hardware on a cluster) and
// for those with more workers than cores (6-node jobs: 5 workers forming at once on 2 cores).
// The planner's copy plan is recomputed here (same synthetic profile, same policy) to find the
// busiest link's bytes; its total is checked against the record's.
//
// Coordinator losses (recovery_coordinator): oobleck-local runs the default job with one coordinator
// fault per run (killed in the middle of a step, killed right after it decided a commit that reached
// one node, frozen longer than the connection timeout), repeated; the downtime is the replacement's
// coordinator_restored record (the nodes' last commit before -> the first commit after), printed
// beside the worker losses' of the same job, and each run's trajectory is checked against a
// failure-free run.
//
// Results: a table on stdout and, with --json, one object that oobleck-sim reads as recovery costs
// (--recovery-costs): detection_ms, planning_ms, copy_bytes_per_s, source, and "measured" with
// every figure. --plot draws the trace replay's throughput over time (gnuplot).
//
// Its parts: recovery_cluster (the local cluster), recovery_faults and recovery_report (the fault
// scenarios, their tables and targets), recovery_plan (the planner's view of the jobs),
// recovery_trace (the trace replay), recovery_copy_probe (the copy path over one link on idle cores),
// recovery_coordinator (the coordinator losses);
// this file: the flags, the jobs and scenarios, and the recovery-costs file.
//
// usage: recovery [--quick] [--json PATH] [--plot PNG] [--bin DIR] [--trace CSV] [--time-scale X]
//                 [--transport-json PATH] [--copy-link-only] [--coordinator-runs N]
//                 [--coordinator-faults LIST] [--coordinator-hang-s S] [--coordinator-only]

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_toml.hpp"
#include "bench/recovery_coordinator.hpp"
#include "bench/recovery_copy_probe.hpp"
#include "bench/recovery_faults.hpp"
#include "bench/recovery_plan.hpp"
#include "bench/recovery_report.hpp"
#include "bench/recovery_stats.hpp"
#include "bench/recovery_trace.hpp"
#include "sim/recovery_costs.hpp"

namespace fs = std::filesystem;
namespace apps = oobleck::apps;
using namespace oobleck::bench;

int main(int argc, char** argv) try {
  bool quick = false, link_only = false;
  std::string json_path, plot_path, bin = OOBLECK_APPS_DIR;
  std::string trace_path = std::string(OOBLECK_TRACES_DIR) + "/bamboo-p3-trace.csv";
  std::string transport_json = std::string(OOBLECK_SOURCE_DIR) + "/bench/results/transport_vs_gloo.json";
  std::string transport_label = "bench/results/transport_vs_gloo.json";
  double time_scale = 0.005;
  int coordinator_repeats = 10;
  std::string coordinator_kinds = "kill,commit,hang";
  double coordinator_hang_s = 3;
  bool coordinator_only = false;
  oobleck::bench::flag_set app{
      "recovery: crash (kill -9) and hang (SIGSTOP) of a worker on the local cluster: detection, decision,\n"
      "copy and downtime; then the coordinator killed and frozen (oobleck-local, repeated runs): its\n"
      "downtime beside a worker's; then the trace's removals replayed as kills, time-scaled. --json writes\n"
      "oobleck-sim's recovery-costs file (the coordinator losses under measured.coordinator_loss).",
      "recovery"};
  app.add_switch("--quick", quick, "a smoke run: fewer scenarios, time scale 0.001 unless --time-scale is given");
  app.add_text("--json", json_path,
               "write oobleck-sim's recovery-costs file (every figure under \"measured\") to PATH");
  app.add_text("--plot", plot_path, "draw the trace replay's throughput over time to PNG (gnuplot)");
  app.add_text("--bin", bin,
               "the folder of oobleck-coordinator, oobleck-worker and oobleck-local (default: the build's)");
  app.add_text("--trace", trace_path,
               "the node availability trace to replay (default: bamboo-p3-trace.csv of the traces folder)");
  auto scale_flag =
      app.add_number("--time-scale", time_scale, 0, "trace time x this = local time (default 0.005; --quick: 0.001)");
  auto transport_flag = app.add_text("--transport-json", transport_json,
                                     "transport_vs_gloo's JSON, for the single p2p reference of earlier runs (default "
                                     "bench/results/transport_vs_gloo.json)");
  app.add_switch(
      "--copy-link-only", link_only,
      "only the copy path over one link on idle cores against the transport's p2p for the same bytes (seconds; "
      "no cluster, nothing written)");
  auto repeats_flag = app.add_integer("--coordinator-runs", coordinator_repeats, 0, 1000,
                                      "runs of each coordinator fault, one fault a run (default 10; --quick: 1)");
  auto kinds_flag =
      app.add_text("--coordinator-faults", coordinator_kinds,
                   "the coordinator faults, a comma-separated list of kill (SIGKILL in the middle of a step), "
                   "commit (killed once it decided a commit that reached one node) and hang (frozen for "
                   "--coordinator-hang-s); default kill,commit,hang; --quick: kill")
          .type_name("LIST");
  app.add_number("--coordinator-hang-s", coordinator_hang_s, 0,
                 "seconds a hang freezes the coordinator, above the job's connection timeout (default 3)");
  app.add_switch("--coordinator-only", coordinator_only,
                 "only the coordinator losses (no worker faults, copy probe or trace replay); --json then writes their "
                 "figures alone, not a recovery-costs file");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  if (quick && !repeats_flag.given()) coordinator_repeats = 1;
  if (quick && !kinds_flag.given()) coordinator_kinds = "kill";
  const bool scale_given = scale_flag.given();
  if (transport_flag.given()) transport_label = transport_json;
  if (quick && !scale_given) time_scale = 0.001;
  const auto bench_started = clock_type::now();
  const std::string load_start = load_average();
  std::cout << "recovery benchmark" << (quick ? " (quick)" : "") << ", load average " << load_start << "\n";

  const std::string small_job = default_job_text(bin);
  const std::string large_job = with_keys(small_job, {{"model", "d_model", 128},
                                                      {"model", "heads", 4},
                                                      {"model", "blocks", 12},
                                                      {"cluster", "device_memory_bytes", 25165824}});
  // For the copy bandwidth: a model whose copies are tens of MB (per block 9.4 MB of state).
  const std::string xl_job = with_keys(small_job, {{"model", "d_model", 256},
                                                   {"model", "heads", 4},
                                                   {"model", "blocks", 8},
                                                   {"cluster", "device_memory_bytes", 67108864}});
  // For copies where every worker left has a core of its own (2 on this machine), as each node has
  // its own hardware on a cluster: the xl model on 3 nodes with room for it on one (n0 = 1) and 2
  // microbatches per step, so the plan is a 1-node and a 2-node pipeline; losing a node of the
  // 2-node one leaves two 1-node pipelines, and the survivor of the pair receives the other half
  // of the model (about 39 MB) over one link.
  const std::string xl3_job = with_keys(xl_job, {{"cluster", "device_memory_bytes", 1073741824},
                                                 {"training", "global_batch", 8},
                                                 {"training", "microbatch", 4}});
  if (link_only) {  // the large and xl jobs' two-block copies, as their single-link events move them
    for (const auto& [name, text] : {std::pair{"large", large_job}, std::pair{"xl", xl_job}}) {
      const copy_link link = measure_copy_link(apps::parse_job(text, "job"), 1, 3, 15);
      const double p2p_link = measure_p2p_gbps({static_cast<std::int64_t>(link.bytes)}, 3).begin()->second;
      std::cout << name << " model, layers 1-2, " << fmt("%.0f", link.bytes) << " bytes: copy " << fmt("%.2f", link.copy_ms)
                << " ms (wait " << fmt("%.2f", link.wait_ms) << "), " << fmt("%.2f", link.gb_per_s())
                << " GB/s = " << fmt("%.2f", link.gb_per_s() / p2p_link) << " of p2p for those bytes ("
                << fmt("%.2f", p2p_link) << " GB/s now)\n";
    }
    return 0;
  }
  // Every scenario runs the job's default heartbeats (cluster.heartbeat_interval_ms and
  // connection_timeout_ms), in the job file and on the workers' flags alike.
  const apps::cluster_section defaults;
  const int hb = defaults.heartbeat_interval_ms, to = defaults.connection_timeout_ms;
  const std::string hang_name = "hang, default " + default_heartbeat() + " ms";

  // The coordinator losses: the default job, the fault in the middle of step 5 of 9 (three
  // failure-free intervals before it, three steps after the one it hit).
  coordinator_runs coordinator{.bin = bin, .job_text = small_job, .steps = 9, .faults = {}, .repeats = coordinator_repeats};
  for (std::size_t at = 0; at <= coordinator_kinds.size();) {
    const auto comma = std::min(coordinator_kinds.find(',', at), coordinator_kinds.size());
    const std::string kind = coordinator_kinds.substr(at, comma - at);
    at = comma + 1;
    if (kind.empty()) continue;
    if (kind != "kill" && kind != "commit" && kind != "hang") {
      std::cerr << "error: --coordinator-faults: unknown fault '" << kind << "' (kill, commit or hang)\n";
      return 2;
    }
    if (kind == "hang" && coordinator_hang_s * 1000 <= to) {
      std::cerr << "error: --coordinator-hang-s: " << coordinator_hang_s << " s is not above the connection timeout ("
                << to << " ms): the workers would not lose the coordinator\n";
      return 2;
    }
    coordinator.faults.push_back(coordinator_fault_of(kind, 5, coordinator_hang_s));
  }
  auto run_coordinator = [&](const std::vector<fault_result>& workers) {
    std::vector<coordinator_result> runs;
    if (coordinator.faults.empty() || coordinator.repeats == 0) return runs;
    std::cout << "\n";
    runs = run_coordinator_losses(coordinator);
    print_coordinator_tables(runs, workers);
    return runs;
  };
  auto failed_runs = [](const std::vector<coordinator_result>& runs) {
    return std::count_if(runs.begin(), runs.end(), [](const coordinator_result& r) { return !r.ok(); });
  };
  if (coordinator_only) {
    const auto runs = run_coordinator({});
    json j = coordinator_json(coordinator, runs, {});
    j["machine_load_average"] = {{"start", load_start}, {"end", load_average()}};
    j["quick"] = quick;
    if (!json_path.empty()) {
      std::ofstream(json_path) << j.dump(2) << "\n";
      std::cout << "wrote " << json_path << "\n";
    }
    std::cout << "total " << fmt("%.0f", ms_between(bench_started, clock_type::now()) / 1000) << " s, load average "
              << load_average() << "\n";
    return failed_runs(runs) ? 1 : 0;
  }

  std::vector<scenario> scenarios;
  if (quick) {
    scenarios.push_back({"crash", "default", small_job, 6, 12, hb, to, {{6, 2, SIGKILL}}});
    scenarios.push_back({hang_name, "default", small_job, 6, 12, hb, to, {{6, 2, SIGSTOP}}});
    scenarios.push_back({"crash", "xl-3n", xl3_job, 3, 6, hb, to, {{4, 1, SIGKILL}}});
  } else {
    scenarios.push_back({"crash", "default", small_job, 6, 50, hb, to, {{15, 2, SIGKILL}, {35, 4, SIGKILL}}});
    scenarios.push_back({"crash", "large", large_job, 6, 16, hb, to, {{5, 2, SIGKILL}, {11, 4, SIGKILL}}});
    scenarios.push_back({"crash", "xl", xl_job, 6, 12, hb, to, {{4, 2, SIGKILL}, {9, 4, SIGKILL}}});
    scenarios.push_back({hang_name, "default", small_job, 6, 50, hb, to, {{15, 2, SIGSTOP}, {35, 4, SIGSTOP}}});
    scenarios.push_back({hang_name, "large", large_job, 6, 10, hb, to, {{5, 2, SIGSTOP}}});
    for (int victim : {1, 0, 1, 0})  // either node of the 2-node pipeline
      scenarios.push_back({"crash", "xl-3n", xl3_job, 3, 8, hb, to, {{4, victim, SIGKILL}}});
  }
  std::vector<fault_result> results;
  int spurious = 0;
  for (const auto& s : scenarios)
    for (auto& r : run_scenario(bin, s, spurious)) results.push_back(std::move(r));

  // --- the tables and the targets
  double mean_copy_bytes = 0;
  int with_copies = 0;
  for (const auto& r : results)
    if (!r.record.is_null() && r.copies > 0) {
      mean_copy_bytes += r.record["copy_bytes"].get<double>() / r.copies;
      ++with_copies;
    }
  mean_copy_bytes = with_copies ? mean_copy_bytes / with_copies : 0;
  const auto p2p = p2p_gbps(transport_json, mean_copy_bytes);
  // Each event's busiest link against the transport's p2p for as many bytes in one message,
  // measured now: the busiest links move 0.15-20 MB, and the transport's bandwidth depends on the
  // size (transport_vs_gloo: 4.98 GB/s for 4 MiB messages, which stay in this VM's 32 MiB L3,
  // 3.46 for 16 MiB, which do not) and on the VM's moment (up to 2x between runs).
  // One-layer probe below: the xl model's blocks, as the xl events copy them (the default model's
  // for --quick), for the copy path against the transport's p2p without five processes around.
  const apps::job_file probe_job = apps::parse_job(quick ? small_job : xl_job, "job");
  const int probe_end = std::min(3, probe_job.model.num_layers() - 1);
  const copy_link link = measure_copy_link(probe_job, 1, probe_end, quick ? 3 : 7);
  // Links under 1 MiB get no reference: their copies are latency, and so is the p2p time of as many
  // bytes, which less a small message's round trip comes out near zero.
  auto referenced = [](const fault_result& r) { return r.busiest_bytes >= (1 << 20); };
  std::vector<std::int64_t> sizes{static_cast<std::int64_t>(link.bytes)};
  for (const auto& r : results)
    if (referenced(r)) sizes.push_back(r.busiest_bytes);
  const auto p2p_now = measure_p2p_gbps(sizes, quick ? 1 : 3);  // bytes -> GB/s
  for (auto& r : results)
    if (referenced(r)) r.p2p_gb_per_s = p2p_now.at(r.busiest_bytes);
  print_fault_tables(results);
  const copy_fit fit = fit_copy_time(results);
  const fault_summary figures = summarize(results);
  const json targets = print_targets(figures, p2p);
  if (!std::isnan(fit.bytes_per_ms))
    std::cout << "copy_ms against the busiest link's bytes: " << fmt("%.1f", fit.fixed_ms) << " ms + bytes / "
              << fmt("%.3f", fit.bytes_per_ms / 1e6) << " GB/s (fixed part: readies, messages, installs)\n";
  if (spurious) std::cout << "spurious losses (a healthy node timed out): " << spurious << "\n";
  std::cout << "copy path over one link on idle cores (layers 1-" << probe_end - 1 << " of the " << (quick ? "default" : "xl")
            << " model, " << fmt("%.0f", link.bytes) << " bytes, ranks on threads of this process): " << fmt("%.2f", link.copy_ms)
            << " ms (wait " << fmt("%.2f", link.wait_ms) << "), " << fmt("%.2f", link.gb_per_s()) << " GB/s";
  const double link_p2p = p2p_now.at(static_cast<std::int64_t>(link.bytes));
  std::cout << " = " << fmt("%.2f", link.gb_per_s() / link_p2p) << " of p2p for those bytes ("
            << fmt("%.2f", link_p2p) << " GB/s now)";
  std::cout << "\n";

  // --- coordinator losses
  const auto coordinator_results = run_coordinator(results);
  std::cout << "\n";

  // --- trace replay
  const json replay_json = run_trace_replay(
      {.bin = bin, .job_text = small_job, .trace_path = trace_path, .plot_path = plot_path, .time_scale = time_scale, .quick = quick});

  // --- the recovery-costs file
  const double detection = median(figures.crash_detect);
  std::vector<double> reconfig;  // first notice -> the resumed step's start, less the copy's marginal time
  for (const auto& r : results) {
    if (!is_crash(r) || r.record.is_null() || std::isnan(r.resumed_step_ms)) continue;
    const double to_start = r.resume_ms - r.resumed_step_ms - r.detect_ms;
    const double copy_part = std::isnan(fit.bytes_per_ms) ? 0 : r.busiest_bytes / fit.bytes_per_ms;
    reconfig.push_back(std::max(0.0, to_start - copy_part));
  }
  const double planning_ms = median(reconfig);
  double copy_bps = std::isnan(fit.bytes_per_ms) ? NAN : fit.bytes_per_ms * 1e3;
  std::string copy_how = "marginal: Theil-Sen slope of copy_ms against the busiest link's bytes over every event (pairs differing >= 2x in size)";
  if (std::isnan(copy_bps)) {  // one size only: the effective figure (fixed costs included)
    std::vector<double> eff;
    for (const auto& r : results)
      if (!r.record.is_null() && r.busiest_bytes > 0) eff.push_back(r.busiest_bytes / r.record["form_ms"].get<double>() * 1e3);
    copy_bps = median(eff);
    copy_how = "effective: the busiest link's bytes / form_ms (mesh connect, stage views and messages included)";
  }
  json measured;
  measured["machine_load_average"] = {{"start", load_start}, {"end", load_average()}};
  measured["quick"] = quick;
  measured["method"] =
      "the bench starts oobleck-coordinator and oobleck-worker processes, reads the coordinator's job events "
      "(--events-out) and sends SIGKILL / SIGSTOP to a worker half a failure-free step after a step_committed event; "
      "detect = fault -> first failure notice (node_lost or step_failed; the event's unix_ms against the system clock "
      "read just before the signal); the decision, copy and downtime come from the coordinator's 'reconfigured' record";
  measured["events"] = json::array();
  for (const auto& r : results) measured["events"].push_back(result_json(r));
  json summary;
  summary["crash_detect_ms"] = stats(figures.crash_detect);
  summary["crash_loss_notice_ms"] = stats(figures.crash_lost);
  summary["hang_detect_ms_default_1000_10000"] = stats(figures.hang_default);
  summary["hang_detect_ms_200_1500"] = stats(figures.hang_short);
  summary["decision_ms"] = stats(figures.decisions);
  summary["copy_gb_per_s_effective"] = stats(figures.bandwidths);
  summary["copy_gb_per_s_all_links"] = stats(figures.bandwidths_all);
  summary["copy_fit"]["fixed_ms"] = fit.fixed_ms;
  summary["copy_fit"]["gb_per_s"] = fit.bytes_per_ms / 1e6;
  summary["copy_fit"]["points"] = fit.points;
  if (p2p) {  // the single reference this benchmark used before
    summary["host_p2p"]["gb_per_s"] = p2p->first;
    summary["host_p2p"]["bytes"] = p2p->second;
    summary["host_p2p"]["from"] = transport_label;
  }
  summary["copy_vs_p2p_for_busiest_bytes"] = stats(figures.bandwidth_ratios);
  summary["copy_vs_p2p_for_busiest_bytes_large_events_more_workers_than_cores"] = stats(figures.large_bandwidth_ratios);
  summary["copy_all_links_vs_p2p_for_busiest_bytes"] = stats(figures.bandwidth_all_ratios);
  summary["copy_all_links_vs_p2p_for_busiest_bytes_large_events_more_workers_than_cores"] = stats(figures.large_bandwidth_all_ratios);
  summary["copy_vs_p2p_for_busiest_bytes_large_events_core_per_worker"] = stats(figures.own_core_bandwidth_ratios);
  summary["copy_one_link_idle"]["bytes"] = link.bytes;
  summary["copy_one_link_idle"]["copy_ms"] = link.copy_ms;
  summary["copy_one_link_idle"]["copy_wait_ms"] = link.wait_ms;
  summary["copy_one_link_idle"]["gb_per_s"] = link.gb_per_s();
  summary["copy_one_link_idle"]["p2p_gb_per_s_for_its_bytes"] = link_p2p;
  summary["copy_one_link_idle"]["vs_p2p_for_its_bytes"] = link.gb_per_s() / link_p2p;
  summary["downtime_within_bound"]["met"] = figures.bound_met;
  summary["downtime_within_bound"]["of"] = figures.bound_total;
  summary["spurious_losses"] = spurious;
  measured["summary"] = summary;
  measured["targets"] = targets;
  measured["trace_replay"] = replay_json;
  measured["coordinator_loss"] = coordinator_json(coordinator, coordinator_results, results);
  measured["how_the_costs_were_derived"] = {
      {"detection_ms", "median crash detection (kill -9 -> the coordinator's first failure notice); a hang costs the "
                       "heartbeat timeout instead (summary.hang_detect_ms_*)"},
      {"planning_ms", "median over crashes of (first failure notice -> the resumed step's start) minus the copy's "
                      "marginal time: the decision, epoch messages, mesh connect and stage views"},
      {"copy_bytes_per_s", copy_how}};
  json costs;
  // A figure this run could not measure is left out: the simulator's default then applies.
  if (std::isfinite(detection)) costs["detection_ms"] = detection;
  if (std::isfinite(planning_ms)) costs["planning_ms"] = planning_ms;
  if (std::isfinite(copy_bps) && copy_bps > 0) costs["copy_bytes_per_s"] = copy_bps;
  costs["source"] = std::string("bench/recovery") + (quick ? " --quick" : "") +
                    ": the local cluster (oobleck-coordinator + workers on 127.0.0.1, host transport)";
  costs["measured"] = measured;
  std::cout << "\nrecovery costs for oobleck-sim: detection " << fmt("%.1f", detection) << " ms, planning "
            << fmt("%.1f", planning_ms) << " ms, copy " << fmt("%.3g", copy_bps) << " bytes/s\n";
  // The simulator must read what we write.
  const auto text = costs.dump(2);
  oobleck::sim::parse_recovery_costs(text, "recovery.json");
  if (!json_path.empty()) {
    std::ofstream(json_path) << text << "\n";
    std::cout << "wrote " << json_path << "\n";
  }
  std::cout << "total " << fmt("%.0f", ms_between(bench_started, clock_type::now()) / 1000) << " s, load average "
            << load_average() << "\n";
  if (const auto failed = failed_runs(coordinator_results)) {
    std::cout << failed << " coordinator-loss run(s) failed (above)\n";
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
