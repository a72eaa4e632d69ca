#include "apps/sim_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>

#include "apps/flags.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "sim/bamboo_policy.hpp"
#include "sim/checkpoint_restart_policy.hpp"
#include "sim/failure_process.hpp"
#include "sim/replica_group_policy.hpp"
#include "sim/model_zoo.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/report.hpp"
#include "sim/simulator.hpp"
#include "sim/varuna_policy.hpp"

namespace oobleck::apps {

namespace {

using messages::input_error;

constexpr const char* kAbout = R"(Simulates training under a node availability trace (lines 'ms,add|remove,nodeN', as in the
Bamboo and Oobleck artifacts) with Oobleck's real planner (templates, instantiation, batch
distribution, reconfiguration policy, copy plans) and with Varuna-like checkpoint-restart and
Bamboo-like redundant computation on the same profile and cost model. Prints average samples/s per
policy and where the wall time went (effective, redundant, fallback, reconfiguration, checkpoint,
restart, stopped).

The model comes from a profile (--profile, as written by oobleck-profile) or is generated
analytically for one of the paper's models (--model: bert-large, gpt2, gpt3-medium, gpt3-2.7b,
gpt3-6.7b; A40-class GPU, one per node; --global-batch and --microbatch default to the paper's
Table 1). Trace times: milliseconds, CRLF tolerated, at equal times adds before removes; a node is
ready --ready-delay-s after its add, except those added at the trace's first time (the starting
cluster). The simulation ends at the trace's last event unless --duration-s says otherwise.

Instead of a trace, --random-failures draws failures from a process: every node fails after an
exponential time with the job's MTTF (--mttf-h, over its --nodes nodes; default Meta's HPCA 2025
figures, 7.9 h at 1,024 GPUs and 1.8 h at 16,384, interpolated log-log for nodes x GPUs per node),
optionally comes back --repair-h later as a new node, and --spare-nodes wait beside the job; the
same --seed gives the same failures. Policies for that scale: ckpt-restart (checkpoint-restart with
asynchronous checkpoints, as large runs do it) and torchft (replica groups, as TorchFT does it),
beside oobleck. --model dense-400b is a 126-layer ~400B dense transformer on 8-GPU H100 nodes
(sim/model_zoo.hpp), priced with the frontier recovery costs (sim/recovery_costs.cpp).

Exit status: 0 on success, 2 on bad input (one "error: ..." line), 1 on an internal failure.)";

struct sim_options {
  std::string profile_path;
  std::string bamboo_profile_path;
  std::string model;
  std::optional<int> nodes;
  std::optional<int> fault_tolerance;
  std::optional<int> global_batch;
  std::optional<int> microbatch;
  std::optional<int> bamboo_microbatch;
  std::optional<int> gpus_per_node;
  std::string trace_path;
  std::string policy = "all";
  std::string costs_path;
  double ready_delay_s = 45;
  double time_scale = 1;
  double duration_s = -1;
  double state_factor = 4;
  bool json = false;
  std::string plot_path;
  bool random_failures = false;
  double mttf_h = 0;  // 0: Meta's for the job's size
  double repair_h = 0;
  int spare_nodes = 0;
  std::int64_t seed = 1;
  int max_template_nodes = 0;
  bool state_factor_given = false;
};

/// The policies --policy names, in report order.
std::vector<std::string> policy_names(const std::string& flag) {
  if (flag == "all") return {"oobleck", "varuna", "bamboo"};
  if (flag == "scale") return {"oobleck", "ckpt-restart", "torchft"};
  std::vector<std::string> names;
  std::size_t start = 0;
  while (start <= flag.size()) {
    const auto comma = flag.find(',', start);
    const std::string name = flag.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name != "oobleck" && name != "varuna" && name != "bamboo" && name != "ckpt-restart" && name != "torchft")
      throw input_error("--policy: unknown policy '" + name +
                        "' (oobleck, varuna, bamboo, ckpt-restart, torchft, a comma-separated list of them, all or scale)");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

bool parse(const std::vector<std::string>& args, std::ostream& out, sim_options& o) {
  CLI::App app{"", "oobleck-sim"};
  app.footer(kAbout);
  add_text(app, "--profile", o.profile_path, "profile file (JSON or Cap'n Proto), e.g. oobleck-profile's output")
      ->type_name("FILE");
  add_text(app, "--model", o.model, "generate the profile of one of the paper's models (or dense-400b, 126 layers on 8-GPU H100 nodes) instead")->type_name("NAME");
  add_text(app, "--trace", o.trace_path, "node availability trace (ms,add|remove,node)")->type_name("FILE");
  app.add_flag("--random-failures", o.random_failures,
               "draw failures from the exponential process instead of a trace (needs --nodes and --duration-s)");
  add_number(app, "--mttf-h", o.mttf_h, 1e-9,
             "the job's mean time to failure in hours (default: Meta's for nodes x GPUs per node)");
  add_number(app, "--repair-h", o.repair_h, 0, "hours until a failed node comes back as a new node (default 0: never)");
  add_integer(app, "--spare-nodes", o.spare_nodes, 0, 1 << 16, "nodes ready beside the job's, failing alike (default 0)")
      ->type_name("S");
  add_integer(app, "--seed", o.seed, 0, std::numeric_limits<std::int64_t>::max(), "failure process seed (default 1)")
      ->type_name("S");
  add_integer(app, "--max-template-nodes", o.max_template_nodes, 0, 1 << 16,
              "plan templates only up to this many nodes (default 0: all, as the planner does)")
      ->type_name("N");
  add_integer(app, "--nodes", o.nodes, 1, 1 << 16,
              "most nodes the job uses (default: the most ready at once in the trace); more wait as spares")
      ->type_name("N");
  add_integer(app, "--fault-tolerance", o.fault_tolerance, 0, 1 << 16, "Oobleck's f: at least f+1 pipelines")
      ->type_name("F")
      ->required();
  add_integer(app, "--global-batch", o.global_batch, 1, 1 << 30, "samples per step, every policy (B)")->type_name("B");
  add_integer(app, "--microbatch", o.microbatch, 1, 1 << 30, "Oobleck's and Varuna's microbatch (b)")->type_name("b");
  add_integer(app, "--bamboo-microbatch", o.bamboo_microbatch, 1, 1 << 30,
              "Bamboo's microbatch (default: Table 1's with --model, else b)")
      ->type_name("b");
  add_text(app, "--bamboo-profile", o.bamboo_profile_path,
           "profile Bamboo runs (default: --profile's; with --model, the model without activation checkpointing)")
      ->type_name("FILE");
  add_integer(app, "--gpus-per-node", o.gpus_per_node, 1, 1 << 10, "checked against the profile")->type_name("M");
  app.add_option("--policy", o.policy,
                 "oobleck, varuna, bamboo, ckpt-restart, torchft or a comma-separated list; all = oobleck,varuna,bamboo "
                 "(the default with --trace), scale = oobleck,ckpt-restart,torchft (the default with --random-failures)")
      ->type_name("NAME")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_text(app, "--recovery-costs", o.costs_path,
           "JSON of recovery constants (written by the fault-tolerance benchmark; default: documented defaults)")
      ->type_name("FILE");
  add_number(app, "--ready-delay-s", o.ready_delay_s, 0, "seconds from a node's add to its readiness (default 45)");
  add_number(app, "--time-scale", o.time_scale, 1e-9,
             "multiply trace times by X, e.g. 0.01 to compare with a local cluster replaying the trace 100x faster");
  add_number(app, "--duration-s", o.duration_s, 0, "simulated seconds from the trace's first time");
  add_number(app, "--state-factor", o.state_factor, 1e-9, "bytes of training state per parameter byte (default 4)");
  app.add_flag("--json", o.json, "print one JSON object instead of the report");
  add_text(app, "--plot", o.plot_path, "write a throughput-over-time PNG (needs gnuplot)")->type_name("OUT.png");
  if (!parse_flags(app, args, out)) return false;
  o.state_factor_given = app.count("--state-factor") > 0;
  if (o.profile_path.empty() == o.model.empty()) throw input_error("give exactly one of --profile and --model (see --help)");
  if (o.trace_path.empty() == !o.random_failures)
    throw input_error("give exactly one of --trace and --random-failures (see --help)");
  if (o.random_failures) {
    if (!o.nodes) throw input_error("--random-failures needs --nodes");
    if (o.duration_s < 0) throw input_error("--random-failures needs --duration-s");
    if (o.duration_s == 0) throw input_error("--duration-s must be > 0 with --random-failures");
    if (app.count("--policy") == 0) o.policy = "scale";
    for (const char* flag : {"--ready-delay-s", "--time-scale"})
      if (app.count(flag) > 0) throw input_error(std::string(flag) + " goes with --trace, not --random-failures");
  } else {
    for (const char* flag : {"--mttf-h", "--repair-h", "--spare-nodes", "--seed"})
      if (app.count(flag) > 0) throw input_error(std::string(flag) + " goes with --random-failures, not --trace");
  }
  policy_names(o.policy);  // refuses an unknown name before anything runs
  if (!o.model.empty() && !o.bamboo_profile_path.empty())
    throw input_error("--bamboo-profile goes with --profile, not --model");
  if (o.profile_path.empty() == false)
    for (const auto& [flag, v] : {std::pair{"--global-batch", o.global_batch}, std::pair{"--microbatch", o.microbatch}})
      if (!v) throw input_error(std::string(flag) + " is required with --profile (see --help)");
  return true;
}

bool app_state_factor_given(const sim_options& o) { return o.state_factor_given; }

/// The profiles every policy runs, from the flags.
sim::sim_job make_job(const sim_options& o) {
  sim::sim_job job;
  job.fault_tolerance = *o.fault_tolerance;
  job.state_factor = o.state_factor;
  if (o.model == "dense-400b") {
    // Its nodes are the job's: the batch is one sequence per node (sim/model_zoo.hpp).
    if (o.gpus_per_node && *o.gpus_per_node != 8) throw input_error("dense-400b runs on 8-GPU nodes (--gpus-per-node 8)");
    if (o.microbatch && *o.microbatch != 1) throw input_error("dense-400b's profile is for microbatch 1");
    job = sim::frontier_job(1, *o.fault_tolerance);
    if (o.global_batch) job.global_batch = *o.global_batch;
    if (app_state_factor_given(o)) job.state_factor = o.state_factor;
    return job;
  }
  if (!o.model.empty()) {
    const auto& m = sim::find_model(o.model);
    sim::device_spec device;
    if (o.gpus_per_node) {
      if (!planning::is_power_of_two(*o.gpus_per_node))
        throw input_error("--gpus-per-node must be a power of two, got " + std::to_string(*o.gpus_per_node));
      device.gpus_per_node = *o.gpus_per_node;
    }
    sim::model_spec spec = m;
    if (o.global_batch) spec.global_batch = *o.global_batch;
    if (o.microbatch) spec.microbatch = *o.microbatch;
    if (o.bamboo_microbatch) spec.bamboo_microbatch = *o.bamboo_microbatch;
    job = sim::paper_job(spec, 0, *o.fault_tolerance, device);
    job.state_factor = o.state_factor;
    if (job.global_batch % job.bamboo_microbatch != 0)
      throw input_error("global batch " + std::to_string(job.global_batch) +
                        " is not a multiple of Bamboo's microbatch " + std::to_string(job.bamboo_microbatch));
    return job;
  }
  job.global_batch = *o.global_batch;
  job.microbatch = *o.microbatch;
  job.profile = messages::read_profile_file(o.profile_path);
  planning::check_matches(job.profile, {.microbatch_size = job.microbatch, .gpus_per_node = o.gpus_per_node});
  if (o.bamboo_profile_path.empty()) {
    job.bamboo_profile = job.profile;
    job.bamboo_microbatch = job.microbatch;
    if (o.bamboo_microbatch && *o.bamboo_microbatch != job.microbatch)
      throw input_error("--bamboo-microbatch " + std::to_string(*o.bamboo_microbatch) +
                        " needs --bamboo-profile measured for it (--profile is for microbatch " +
                        std::to_string(job.microbatch) + ")");
  } else {
    job.bamboo_profile = messages::read_profile_file(o.bamboo_profile_path);
    job.bamboo_microbatch = o.bamboo_microbatch.value_or(job.bamboo_profile.microbatch_size);
    planning::check_matches(job.bamboo_profile,
                            {.microbatch_size = job.bamboo_microbatch, .gpus_per_node = job.profile.gpus_per_node});
  }
  if (job.global_batch % job.bamboo_microbatch != 0)
    throw input_error("global batch " + std::to_string(job.global_batch) + " is not a multiple of Bamboo's microbatch " +
                      std::to_string(job.bamboo_microbatch));
  return job;
}

}  // namespace

int run_sim_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return exit_status_of(err, [&] {
    sim_options o;
    if (!parse(args, out, o)) return 0;
    if (!o.plot_path.empty() && sim::find_gnuplot().empty())
      throw input_error("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
    const sim::recovery_costs base = o.model == "dense-400b" ? sim::frontier_recovery_costs() : sim::recovery_costs{};
    const auto recovery = o.costs_path.empty() ? base : sim::read_recovery_costs(o.costs_path, base);
    sim::cluster_trace trace;
    std::string trace_name = o.trace_path;
    double mttf_ms = 0;
    sim::sim_job job = make_job(o);
    if (o.random_failures) {
      const int gpus_per_node = std::max(job.profile.gpus_per_node, 1);
      sim::failure_process fp{.nodes = *o.nodes,
                              .spare_nodes = o.spare_nodes,
                              .mttf_h = o.mttf_h > 0 ? o.mttf_h : sim::default_mttf_h(double(*o.nodes) * gpus_per_node),
                              .repair_h = o.repair_h,
                              .duration_h = o.duration_s / 3600,
                              .seed = static_cast<std::uint64_t>(o.seed)};
      trace = sim::generate_failures(fp);
      trace_name = sim::describe(fp);
      mttf_ms = fp.mttf_h * 3600e3;
    } else {
      const auto events = sim::read_trace(o.trace_path);
      trace = sim::to_cluster_trace(
          events, {.ready_delay_ms = o.ready_delay_s * 1e3, .time_scale = o.time_scale, .initial_nodes_ready = true});
      if (trace.most_alive == 0) throw input_error(o.trace_path + ": no node is ever ready");
    }
    job.nodes = o.nodes.value_or(trace.most_alive);
    if (o.model == "dense-400b" && !o.global_batch) job.global_batch = job.nodes;
    job.max_template_nodes = o.max_template_nodes;
    const double end_ms = o.duration_s >= 0 ? trace.start_ms + o.duration_s * 1e3 : trace.end_ms;

    const auto names = policy_names(o.policy);
    const bool shared = std::any_of(names.begin(), names.end(), [](const std::string& n) {
      return n == "oobleck" || n == "ckpt-restart" || n == "torchft";
    });
    if (shared) job.templates = sim::plan_templates(job);  // planned once for every policy that uses them
    std::vector<std::unique_ptr<sim::policy>> policies;
    for (const auto& name : names) {
      if (name == "oobleck") policies.push_back(std::make_unique<sim::oobleck_policy>(job, recovery, trace.start_ms));
      if (name == "varuna") policies.push_back(std::make_unique<sim::varuna_policy>(job, recovery, trace.start_ms));
      if (name == "bamboo") policies.push_back(std::make_unique<sim::bamboo_policy>(job, recovery, trace.start_ms));
      if (name == "ckpt-restart")
        policies.push_back(std::make_unique<sim::checkpoint_restart_policy>(job, recovery, trace.start_ms, mttf_ms));
      if (name == "torchft")
        policies.push_back(std::make_unique<sim::replica_group_policy>(job, recovery, trace.start_ms));
    }
    std::vector<sim::policy_result> results;
    for (auto& p : policies) results.push_back(sim::simulate(*p, trace, end_ms, job.nodes));

    const sim::run_description d{.model = job.profile.model, .trace = trace_name, .nodes = job.nodes,
                                  .fault_tolerance = job.fault_tolerance, .global_batch = job.global_batch,
                                  .microbatch = job.microbatch, .bamboo_microbatch = job.bamboo_microbatch,
                                  .ready_delay_ms = o.ready_delay_s * 1e3, .time_scale = o.time_scale};
    if (!o.plot_path.empty()) sim::plot_throughput(o.plot_path, d, results);
    if (o.json) out << sim::report_json(d, recovery, results).dump() << "\n";
    else sim::print_report(out, d, recovery, results);
    return 0;
  });
}

}  // namespace oobleck::apps
