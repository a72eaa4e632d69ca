// Goodput at frontier scale (issue 27): the effective training time of Oobleck, checkpoint-restart
// as large runs do it and TorchFT-style replica groups at 1,024, 4,096 and 16,384 GPUs (8 per
// node) on the analytical 126-layer ~400B dense model (sim/model_zoo.hpp, dense-400b), under
// failures drawn from the documented process (sim/failure_process.hpp: exponential per node,
// Meta's MTTF for the job's size) with the same failure sequence for every policy. Constants:
// sim/recovery_costs.cpp, frontier_recovery_costs(). Checks printed, never tuned for:
//   - checkpoint-restart under Llama 3's failure rate (419 unexpected interruptions in 54 days on
//     16,384 GPUs) should show > 90% effective training time, as Llama 3 reports;
//   - Oobleck's goal: >= 97% at 16,384 GPUs under the default rate (1.8 h).
//
// usage: sim_scale [--quick] [--json PATH] [--weeks W] [--seed S] [--repair-h H] [--spare-percent P]
//                  [--max-template-nodes N]

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "sim/checkpoint_restart_policy.hpp"
#include "sim/failure_process.hpp"
#include "sim/model_zoo.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/replica_group_policy.hpp"
#include "sim/report.hpp"
#include "sim/simulator.hpp"

using namespace oobleck::sim;

namespace {

constexpr int kGpusPerNode = 8;
constexpr int kFaultTolerance = 1;
// Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in 54 days, 16,384 GPUs.
constexpr double kLlamaMttfH = 54.0 * 24.0 / 419.0;
constexpr double kOobleckGoal = 0.97;
constexpr double kLlamaEttr = 0.90;

struct scenario {
  int gpus = 0;
  double mttf_h = 0;
  std::string label;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string pct(double x) { return oobleck::bench::fmt("%.1f%%", 100 * x); }

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path = "sim_scale.json";
  double weeks = 2;
  std::int64_t seed = 1;
  double repair_h = 24;
  double spare_percent = -1;
  int max_template_nodes = 0;
  oobleck::bench::flag_set app{
      "sim_scale: effective training time of oobleck, ckpt-restart and torchft at 1,024, 4,096 and 16,384\n"
      "GPUs (dense-400b on 8-GPU H100 nodes) under Meta's MTTF for each size, plus checkpoint-restart\n"
      "under Llama 3's failure rate as a sanity check, and the >= 97% goal for Oobleck at 16,384 GPUs.",
      "sim_scale"};
  app.add_switch("--quick", quick, "1,024 GPUs only, 2 simulated days, templates up to 2 n0 (a smoke run)");
  app.add_text("--json", json_path, "write the results to PATH (default sim_scale.json)");
  app.add_number("--weeks", weeks, 1e-3, "simulated weeks per run (default 2)");
  app.add_integer("--seed", seed, 0, std::numeric_limits<std::int64_t>::max(), "failure process seed (default 1)");
  app.add_number("--repair-h", repair_h, 0, "hours until a failed node comes back (default 24; 0: never)");
  app.add_number("--spare-percent", spare_percent, 0,
                 "spare nodes beyond the job's, percent of its nodes (default: a pool that rarely runs dry, "
                 "the mean + 3 standard deviations of the nodes in repair, plus 1)");
  app.add_integer("--max-template-nodes", max_template_nodes, 0, 1 << 16,
                  "plan templates only up to this many nodes (default 0: all, as the planner does)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  try {
    std::vector<scenario> scenarios;
    for (int g : {1024, 4096, 16384}) {
      scenarios.push_back({g, default_mttf_h(g), "Meta MTTF"});
      if (quick) break;
    }
    if (!quick) scenarios.push_back({16384, kLlamaMttfH, "Llama 3 rate"});
    const double duration_h = quick ? 48 : weeks * 7 * 24;
    const recovery_costs costs = frontier_recovery_costs();
    std::cout << "sim_scale: dense-400b (" << frontier_profile().num_layers() << " layers, "
              << oobleck::bench::fmt("%.0f", frontier_model().parameters() / 1e9) << "B parameters), "
              << duration_h / 24 << " simulated days per run, load " << oobleck::bench::load_average() << "\n"
              << "costs: " << costs.source << "\n\n";

    nlohmann::json runs = nlohmann::json::array();
    std::map<int, std::shared_ptr<const job_templates>> planned;
    double oobleck_16k = -1, ckpt_llama = -1;
    for (const auto& sc : scenarios) {
      const int nodes = sc.gpus / kGpusPerNode;
      sim_job job = frontier_job(nodes, kFaultTolerance);
      job.max_template_nodes = quick && max_template_nodes == 0 ? 0 : max_template_nodes;
      double plan_s = 0;
      if (!planned.count(nodes)) {
        const auto t0 = std::chrono::steady_clock::now();
        if (quick && max_template_nodes == 0) {
          // The smoke run keeps the planner short: n0 .. 2 n0.
          auto probe = job;
          probe.max_template_nodes = 1;
          job.max_template_nodes = 2 * plan_templates(probe)->n0;
        }
        planned[nodes] = plan_templates(job);
        plan_s = seconds_since(t0);
      }
      job.templates = planned[nodes];
      // Nodes in repair at once are about Poisson with mean repair / MTTF (a node fails every MTTF
      // and stays out for the repair time): a run keeps enough spares that the pool rarely runs dry.
      const double in_repair = repair_h / sc.mttf_h;
      const int spares = spare_percent >= 0 ? static_cast<int>(std::ceil(nodes * spare_percent / 100))
                                            : static_cast<int>(std::ceil(in_repair + 3 * std::sqrt(in_repair))) + 1;
      failure_process fp{.nodes = nodes,
                         .spare_nodes = spares,
                         .mttf_h = sc.mttf_h,
                         .repair_h = repair_h,
                         .duration_h = duration_h,
                         .seed = static_cast<std::uint64_t>(seed)};
      const auto trace = generate_failures(fp);
      int failures = 0;
      for (const auto& c : trace.changes) failures += static_cast<int>(c.removed.size());
      const double mttf_ms = sc.mttf_h * 3600e3;

      std::vector<std::unique_ptr<policy>> policies;
      const auto t0 = std::chrono::steady_clock::now();
      policies.push_back(std::make_unique<oobleck_policy>(job, costs, 0));
      policies.push_back(std::make_unique<checkpoint_restart_policy>(job, costs, 0, mttf_ms));
      policies.push_back(std::make_unique<replica_group_policy>(job, costs, 0));
      std::vector<policy_result> results;
      for (auto& p : policies) results.push_back(simulate(*p, trace, trace.end_ms, nodes));
      const double sim_s = seconds_since(t0);

      const auto& tp = *job.templates;
      std::cout << sc.gpus << " GPUs (" << nodes << " nodes + " << fp.spare_nodes << " spares), " << sc.label << ": "
                << describe(fp) << "; " << failures << " failures; templates " << tp.n0 << ".." << tp.n_max
                << (job.max_template_nodes > 0 ? " (capped)" : "") << oobleck::bench::fmt(" planned in %.1f s", plan_s)
                << oobleck::bench::fmt(", simulated in %.2f s\n", sim_s);
      std::cout << "  policy        samples/s(ff)  effective  lost (h): fallback reconfig  ckpt restart stopped slower\n";
      nlohmann::json jr = nlohmann::json::array();
      for (const auto& r : results) {
        const double share = effective_share(r);
        const auto lost = lost_time(r);
        // Hours; a rounding residue (|x| < 1 ms) prints as 0 rather than -0.00.
        auto h = [](double ms) { return std::abs(ms) < 1 ? 0.0 : ms / 3600e3; };
        std::string name = r.policy, share_text = pct(share);
        name.resize(13, ' ');
        share_text.insert(0, share_text.size() < 8 ? 8 - share_text.size() : 0, ' ');
        std::cout << "  " << name << oobleck::bench::fmt(" %13.2f", r.failure_free_samples_per_s) << "  " << share_text
                  << oobleck::bench::fmt("  %18.2f", h(lost.fallback)) << oobleck::bench::fmt(" %8.2f", h(lost.reconfiguration))
                  << oobleck::bench::fmt(" %5.2f", h(lost.checkpoint)) << oobleck::bench::fmt(" %7.2f", h(lost.restart))
                  << oobleck::bench::fmt(" %7.2f", h(lost.stopped)) << oobleck::bench::fmt(" %6.2f", h(lost.slower))
                  << (r.never_runs.empty() ? "" : "  (" + r.never_runs + ")") << "\n";
        const auto series = throughput_series(r, 48);
        jr.push_back({{"policy", r.policy},
                      {"failure_free_samples_per_s", r.failure_free_samples_per_s},
                      {"samples_per_s", r.samples_per_s},
                      {"effective_share", share},
                      {"lost_h",
                       {{"fallback", h(lost.fallback)},
                        {"reconfiguration", h(lost.reconfiguration)},
                        {"checkpoint", h(lost.checkpoint)},
                        {"restart", h(lost.restart)},
                        {"stopped", h(lost.stopped)},
                        {"slower", h(lost.slower)}}},
                      {"decisions", r.decisions.size()},
                      {"series", {{"window_h", duration_h / 48}, {"samples_per_s", series}}},
                      {"never_runs", r.never_runs}});
        if (sc.gpus == 16384 && sc.label == "Meta MTTF" && r.policy == "oobleck") oobleck_16k = share;
        if (sc.label == "Llama 3 rate" && r.policy == "ckpt-restart") ckpt_llama = share;
      }
      // How much the one assumed constant moves checkpoint-restart: MegaScale's optimised (< 30 s)
      // and unoptimised (1,047 s) initialisation of a 12,288-GPU job in place of 300 s.
      nlohmann::json sensitivity = nlohmann::json::array();
      if (sc.gpus == 16384 && !quick)
        for (double restart_s : {30.0, 1047.0}) {
          auto c = costs;
          c.restart_fixed_ms = restart_s * 1e3;
          checkpoint_restart_policy alt(job, c, 0, mttf_ms);
          const double share = effective_share(simulate(alt, trace, trace.end_ms, nodes));
          std::cout << "  ckpt-restart with restart_fixed " << oobleck::bench::fmt("%.0f s", restart_s) << ": "
                    << pct(share) << "\n";
          sensitivity.push_back({{"restart_fixed_s", restart_s}, {"effective_share", share}});
        }
      const auto* cr = dynamic_cast<const checkpoint_restart_policy*>(policies[1].get());
      const auto* ft = dynamic_cast<const replica_group_policy*>(policies[2].get());
      std::cout << "  ckpt-restart: " << cr->configuration().pipelines << " x " << cr->configuration().depth << " grid"
                << oobleck::bench::fmt(", snapshot %.1f s", cr->snapshot_ms() / 1e3)
                << oobleck::bench::fmt(" every %.0f s", cr->interval_ms() / 1e3)
                << oobleck::bench::fmt(", write %.1f s", cr->write_ms() / 1e3)
                << oobleck::bench::fmt(", restart %.0f s", cr->restart_ms() / 1e3)
                << oobleck::bench::fmt("; torchft: group heal %.1f s\n\n", ft->heal_ms() / 1e3);
      if (std::getenv("SIM_SCALE_DECISIONS"))
        for (const auto& r : results)
          for (const auto& d : r.decisions)
            std::cout << "    " << r.policy << oobleck::bench::fmt(" %.3f h ", d.ms / 3600e3) << d.what << " " << d.nodes_in_use
                      << " " << d.detail << "\n";
      runs.push_back({{"gpus", sc.gpus},
                      {"nodes", nodes},
                      {"spare_nodes", fp.spare_nodes},
                      {"mttf_h", sc.mttf_h},
                      {"mttf_source", sc.label},
                      {"failure_process", describe(fp)},
                      {"failures", failures},
                      {"templates", {{"n0", tp.n0}, {"n_max", tp.n_max}, {"capped", job.max_template_nodes > 0}}},
                      {"plan_s", plan_s},
                      {"simulate_s", sim_s},
                      {"checkpoint_interval_s", cr->interval_ms() / 1e3},
                      {"ckpt_restart_sensitivity", sensitivity},
                      {"policies", jr}});
    }
    nlohmann::json checks = nlohmann::json::object();
    if (ckpt_llama >= 0) {
      const bool ok = ckpt_llama > kLlamaEttr;
      std::cout << "sanity: ckpt-restart at 16,384 GPUs under Llama 3's rate (MTTF "
                << oobleck::bench::fmt("%.2f h", kLlamaMttfH) << "): " << pct(ckpt_llama) << ", Llama 3 reports > 90%: "
                << (ok ? "consistent" : "INCONSISTENT") << "\n";
      checks["llama3_ckpt_restart"] = {{"effective_share", ckpt_llama}, {"reported_above", kLlamaEttr}, {"consistent", ok}};
    }
    if (oobleck_16k >= 0) {
      const bool ok = oobleck_16k >= kOobleckGoal;
      std::cout << "goal: oobleck at 16,384 GPUs (MTTF " << oobleck::bench::fmt("%.2f h", default_mttf_h(16384))
                << "): " << pct(oobleck_16k) << ", target >= 97%: " << (ok ? "PASS" : "FAIL") << "\n";
      checks["oobleck_goal"] = {{"effective_share", oobleck_16k}, {"target", kOobleckGoal}, {"pass", ok}};
    }
    nlohmann::json doc = {{"benchmark", "sim_scale"},
                          {"model", "dense-400b"},
                          {"gpus_per_node", kGpusPerNode},
                          {"fault_tolerance", kFaultTolerance},
                          {"duration_h", duration_h},
                          {"seed", seed},
                          {"repair_h", repair_h},
                          {"spare_percent", spare_percent},
                          {"load_average", oobleck::bench::load_average()},
                          {"recovery_costs", costs_json(costs)},
                          {"runs", runs},
                          {"checks", checks}};
    std::ofstream(json_path) << doc.dump(1) << "\n";
    std::cout << "\nJSON: " << json_path << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
