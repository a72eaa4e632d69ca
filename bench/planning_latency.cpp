// Planning latency: the paper's Table 3 grid (one template per cell) on GPT-like synthetic
// profiles, single-threaded, beside the paper's figures; then all templates of a 24-node job,
// instantiation on 1,024 nodes and one reconfiguration decision on 64 nodes; then the frontier
// cases of issue 27 against their targets: every template of a 126-layer model on 2,048 nodes of
// 8 GPUs (<= 5 s, <= 1 GiB), instantiation and a reconfiguration decision at 2,048 nodes
// (<= 10 ms each), and a 1,000-layer profile on 64 nodes (plans or is refused within 5 s).
//
// usage: planning_latency [--quick] [--json PATH]

#include <algorithm>
#include <chrono>
#include <random>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "planning/synthetic_profile.hpp"

using namespace oobleck::planning;
using json = nlohmann::ordered_json;

using oobleck::bench::fmt;

namespace {

// Table 3 of the paper (seconds): rows (nodes, GPUs per node), columns 24/32/64/96 layers.
struct paper_row {
  int nodes, gpus;
  double seconds[4];
};
constexpr int kLayers[4] = {24, 32, 64, 96};
constexpr paper_row kPaper[] = {
    {8, 1, {0.28, 0.71, 9.65, 68.50}},      {8, 4, {0.41, 1.15, 11.58, 74.56}},
    {8, 8, {0.54, 1.50, 20.98, 109.76}},    {16, 1, {3.37, 7.45, 66.35, 540.36}},
    {16, 4, {4.56, 10.41, 108.10, 649.67}}, {16, 8, {4.90, 11.78, 176.04, 1213.63}},
    {24, 1, {11.35, 30.11, 262.47, 1477.54}}, {24, 4, {14.78, 45.80, 472.53, 2153.84}},
    {24, 8, {15.59, 49.25, 520.08, 3297.92}},
};

profile gpt(int layers, int gpus) {
  return synthetic_gpt_profile({.layers = layers, .hidden = 2048, .heads = 16, .sequence = 1024,
                                .microbatch = 1, .gpus_per_node = gpus, .device_memory_bytes = 40LL << 30});
}

/// The same with each layer's times scaled by a factor drawn in [1 - jitter/2, 1 + jitter/2] (seeded),
/// as a measured profile's layers differ: every stage latency is then distinct, the planner's hard case.
profile jittered(profile p, double jitter) {
  std::mt19937 rng(27);
  std::uniform_real_distribution<double> factor(1 - jitter / 2, 1 + jitter / 2);
  for (auto& layer : p.layers) {
    const double f = factor(rng);
    for (auto& t : layer.forward_ms) t *= f;
    for (auto& t : layer.backward_ms) t *= f;
  }
  return p;
}

/// Peak resident set size of this process so far (VmHWM), bytes; -1 where unknown.
double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  return -1;
}

/// Median seconds of fn over repeats, repeating until ~0.3 s of samples (at least 3, 1 if slow).
double time_it(const std::function<void()>& fn) {
  std::vector<double> samples;
  double total = 0;
  while (samples.size() < 3 || (total < 0.3 && samples.size() < 200)) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    samples.push_back(s);
    total += s;
    if (s > 2.0) break;
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path = "planning_latency.json";
  oobleck::bench::flag_set app{
      "planning_latency: regenerates the paper's Table 3 (one pipeline template per cell) on GPT-like\n"
      "synthetic profiles and times instantiation and reconfiguration. Results: a table on stdout, JSON.",
      "planning_latency"};
  app.add_switch("--quick", quick, "the 24-layer column only");
  app.add_text("--json", json_path, "write the results to PATH (default planning_latency.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  json cells = json::array();
  std::cout << "Table 3: one template per cell, seconds (ours | paper | paper/ours)\n";
  std::cout << "nodes GPUs |";
  for (int l : kLayers) std::cout << "            " << l << " layers            |";
  std::cout << "\n";
  double worst_ratio = 1e300;
  for (const auto& row : kPaper) {
    std::cout << fmt("%5.0f", row.nodes) << fmt(" %4.0f", row.gpus) << " |" << std::flush;
    for (int c = 0; c < (quick ? 1 : 4); ++c) {
      const auto prof = gpt(kLayers[c], row.gpus);
      const layer_costs costs(prof, {static_cast<double>(prof.device_memory_bytes), 4.0});
      template_generator gen(costs);
      std::optional<pipeline_template> t;
      const double s = time_it([&] { t = gen.generate(row.nodes); });
      const double ratio = row.seconds[c] / s;
      worst_ratio = std::min(worst_ratio, ratio);
      std::cout << fmt(" %9.5f", s) << fmt(" | %8.2f", row.seconds[c]) << fmt(" | %7.0fx |", ratio) << std::flush;
      cells.push_back(json{{"nodes", row.nodes}, {"gpus_per_node", row.gpus}, {"layers", kLayers[c]},
                                      {"seconds", s}, {"paper_seconds", row.seconds[c]}, {"speedup", ratio},
                                      {"iteration_ms", t ? t->iteration_ms : -1.0},
                                      {"stages", t ? static_cast<int>(t->stages.size()) : 0},
                                      {"caps_evaluated", gen.stats().caps_evaluated},
                                      {"candidate_caps", gen.stats().candidate_caps},
                                      {"feasibility_runs", gen.stats().feasibility_runs}});
    }
    std::cout << "\n";
  }
  std::cout << "slowest cell relative to the paper: " << fmt("%.0f", worst_ratio) << "x faster\n\n";

  // All templates of a job: N = 24, f = 2, 96 layers, 8 GPUs per node.
  const auto big = gpt(quick ? 24 : 96, 8);
  job_config job24{.nodes = 24, .fault_tolerance = 2, .global_batch = 1024, .microbatch = 1};
  job_plan plan24;
  const double all_templates = time_it([&] { plan24 = plan_job(big, job24); });
  std::cout << "all templates + instantiation, N = 24, f = 2, " << big.num_layers() << " layers x 8 GPUs: "
            << plan24.templates.templates.size() << " templates (n0 = " << plan24.spec.n0
            << ", n_max = " << plan24.spec.n_max << ") in " << fmt("%.4f", all_templates) << " s\n";

  // Instantiation + batch distribution on 1,024 nodes from the templates of a 1,024-node job; one
  // GPU per node, so the 96-layer model needs several nodes per pipeline and many templates exist.
  const auto mid = gpt(96, 1);
  job_config job1k{.nodes = 1024, .fault_tolerance = 2, .global_batch = 8192, .microbatch = 1};
  const auto plan1k = plan_job(mid, job1k);
  const auto options = plan1k.templates.options();
  std::optional<instantiation> inst;
  const double inst_s = time_it([&] { inst = instantiate(options, 1024, 3, 8192); });
  std::cout << "instantiation + batch distribution, N = 1024 x 1 GPU, " << mid.num_layers() << " layers, "
            << options.size() << " templates, 8192 microbatches: "
            << fmt("%.3f", inst_s * 1e3) << " ms (target <= 10 ms), " << inst->template_nodes.size() << " pipelines\n";

  // One reconfiguration decision on 64 nodes (one GPU each, pipelines of several nodes): one node
  // of the first pipeline fails.
  job_config job64{.nodes = 64, .fault_tolerance = 2, .global_batch = 1024, .microbatch = 1};
  const auto plan64 = plan_job(mid, job64);
  const layer_costs costs64(mid, job_memory(mid, job64));
  const reconfiguration_context ctx{plan64.templates, costs64, 2, plan64.num_microbatches, 1};
  const cluster_state state{plan64.pipelines, plan64.idle_nodes};
  const std::vector<node_id> lost{plan64.pipelines.front().nodes.front()};
  reconfiguration r;
  const double reconf_s = time_it([&] { r = reconfigure(ctx, state, lost, {}); });
  std::cout << "reconfiguration decision, 64 nodes x 1 GPU, " << mid.num_layers() << " layers, "
            << plan64.pipelines.size() << " pipelines, one node lost: " << fmt("%.3f", reconf_s * 1e3)
            << " ms (target <= 1 ms), " << r.copies.size() << " layer copies (" << r.reason << ")\n";

  // Frontier scale (issue 27).
  std::cout << "\nFrontier scale (issue 27), load average " << oobleck::bench::load_average() << "\n";
  std::cout << "case                                                            | measured      | target    | pass\n";
  json frontier = json::array();
  bool all_pass = true;
  auto report = [&](const std::string& name, double value, const char* unit, double target, json extra) {
    const bool pass = value <= target;
    all_pass = all_pass && pass;
    std::cout << name << std::string(name.size() < 64 ? 64 - name.size() : 0, ' ') << "| "
              << fmt("%9.3f", value) << " " << unit << std::string(4 - std::string(unit).size(), ' ') << "| <= "
              << fmt("%5.0f", target) << " " << unit << std::string(4 - std::string(unit).size(), ' ') << "| "
              << (pass ? "yes" : "NO") << "\n";
    extra["case"] = name;
    extra["value"] = value;
    extra["unit"] = unit;
    extra["target"] = target;
    extra["pass"] = pass;
    frontier.push_back(std::move(extra));
  };
  // Two 126-layer profiles, layer times jittered: GPT-like at hidden 2048 (the profile issue 27's
  // 70 s were measured on; every template fits one stage per node) and Llama-3-405B-like (hidden
  // 16384, 128 heads, sequence 2048, vocabulary 128256, 80 GiB per GPU: n0 = 16, so pipelines span
  // many nodes and a loss re-plans one of them). Instantiation and reconfiguration use the second.
  const int frontier_layers = quick ? 24 : 126;
  struct frontier_profile_case {
    std::string name;
    profile prof;
  };
  const frontier_profile_case frontier_profiles[] = {
      {"GPT hidden 2048", jittered(gpt(frontier_layers, 8), 0.02)},
      {"405B-like", jittered(synthetic_gpt_profile({.layers = frontier_layers, .hidden = 16384, .heads = 128,
                                                    .sequence = 2048, .vocab = 128256, .microbatch = 1,
                                                    .gpus_per_node = 8, .device_memory_bytes = 80LL << 30}),
                             0.02)},
  };
  job_config job2k{.nodes = 2048, .fault_tolerance = 2, .global_batch = 16384, .microbatch = 1};
  job_plan plan2k;
  for (const auto& [profile_name, prof] : frontier_profiles) {
    const double rss_before = peak_rss_bytes();
    const auto start2k = std::chrono::steady_clock::now();
    plan2k = plan_job(prof, job2k);
    const double plan2k_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start2k).count();
    const layer_costs costs(prof, job_memory(prof, job2k));
    const auto memory2k = planning_memory_bytes(costs, plan2k.spec.n_max);
    int inexact = 0;
    for (const auto& t : plan2k.templates.templates) inexact += !t.exact;
    const std::string case2k =
        std::to_string(frontier_layers) + " layers (" + profile_name + ") x 2048 nodes x 8 GPUs: all templates";
    report(case2k, plan2k_s, "s", 5.0,
           json{{"layers", frontier_layers}, {"nodes", 2048}, {"gpus_per_node", 8},
                {"templates", plan2k.templates.templates.size()}, {"n0", plan2k.spec.n0}, {"n_max", plan2k.spec.n_max},
                {"inexact_templates", inexact}, {"profile", profile_name + ", layer times jittered +-1%"}});
    report("  its planning memory (estimate = what is allocated)", memory2k / double(1 << 30), "GiB", 1.0,
           json{{"bytes_estimated", memory2k}, {"peak_rss_bytes", peak_rss_bytes()}, {"peak_rss_before_bytes", rss_before}});
  }
  const auto& big_profile = frontier_profiles[1].prof;
  const layer_costs costs2k(big_profile, job_memory(big_profile, job2k));
  const auto options2k = plan2k.templates.options();
  std::optional<instantiation> inst2k;
  const double inst2k_s = time_it([&] { inst2k = instantiate(options2k, 2048, 3, plan2k.num_microbatches); });
  report("instantiation + batch distribution, 2048 nodes", inst2k_s * 1e3, "ms", 10.0,
         json{{"templates", options2k.size()}, {"pipelines", inst2k ? inst2k->template_nodes.size() : 0},
              {"microbatches", plan2k.num_microbatches}});
  const reconfiguration_context ctx2k{plan2k.templates, costs2k, 2, plan2k.num_microbatches, 1};
  const cluster_state state2k{plan2k.pipelines, plan2k.idle_nodes};
  const std::vector<node_id> lost2k{plan2k.pipelines.front().nodes.front()};
  reconfiguration r2k;
  const double reconf2k_s = time_it([&] { r2k = reconfigure(ctx2k, state2k, lost2k, {}); });
  report("reconfiguration decision, 2048 nodes, one lost", reconf2k_s * 1e3, "ms", 10.0,
         json{{"pipelines", plan2k.pipelines.size()}, {"lost_pipeline_nodes", plan2k.pipelines.front().template_nodes},
              {"copies", r2k.copies.size()}, {"reason", r2k.reason}});
  // 1,000 layers on 64 nodes: plans or is refused at once with the estimate (default memory limit).
  const auto deep = gpt(1000, 8);
  job_config job_deep{.nodes = 64, .fault_tolerance = 1, .global_batch = 512, .microbatch = 1};
  std::string outcome;
  const auto start_deep = std::chrono::steady_clock::now();
  try {
    const auto plan_deep = plan_job(deep, job_deep);
    outcome = "planned: " + std::to_string(plan_deep.templates.templates.size()) + " templates";
  } catch (const planning_error& e) {
    outcome = std::string("refused: ") + e.what();
  }
  const double deep_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_deep).count();
  report("1000 layers x 64 nodes x 8 GPUs: plan or refuse", deep_s, "s", 5.0, json{{"outcome", outcome}});
  std::cout << "  1000 layers x 64 nodes: " << outcome << "\n";
  // For the record (no target): the same with the memory limit lifted, planned exactly.
  json deep_unlimited = nullptr;
  if (!quick) {
    job_deep.plan_memory_limit_bytes = 0;
    const auto start_unlimited = std::chrono::steady_clock::now();
    const auto plan_deep = plan_job(deep, job_deep);
    const double unlimited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_unlimited).count();
    int inexact_deep = 0;
    for (const auto& t : plan_deep.templates.templates) inexact_deep += !t.exact;
    const layer_costs deep_costs(deep, job_memory(deep, job_deep));
    const auto deep_bytes = planning_memory_bytes(deep_costs, plan_deep.spec.n_max);
    std::cout << "  the same with --plan-memory-limit 0: " << plan_deep.templates.templates.size() << " templates ("
              << inexact_deep << " not proven minimal) in " << fmt("%.2f", unlimited_s) << " s, planning memory "
              << fmt("%.2f", deep_bytes / double(1 << 30)) << " GiB, peak RSS now "
              << fmt("%.2f", peak_rss_bytes() / double(1 << 30)) << " GiB\n";
    deep_unlimited = json{{"seconds", unlimited_s}, {"templates", plan_deep.templates.templates.size()},
                          {"inexact_templates", inexact_deep}, {"bytes_estimated", deep_bytes},
                          {"peak_rss_bytes", peak_rss_bytes()}};
  }
  std::cout << "frontier targets " << (all_pass ? "all met" : "NOT all met") << "\n";

  const json out = json{
      {"benchmark", "planning_latency"},
      {"load_average", oobleck::bench::load_average()},
      {"frontier", std::move(frontier)},
      {"frontier_all_pass", all_pass},
      {"deep_without_memory_limit", std::move(deep_unlimited)},
      {"table3", std::move(cells)},
      {"slowest_cell_speedup", worst_ratio},
      {"all_templates_n24_f2_seconds", all_templates},
      {"instantiation_n1024_ms", inst_s * 1e3},
      {"reconfiguration_n64_ms", reconf_s * 1e3},
  };
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::cout << "results written to " << json_path << "\n";
  return 0;
}
