#include "apps/sim_command.hpp"

#include <cmath>
#include <memory>
#include <optional>

#include "apps/flags.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "sim/bamboo_policy.hpp"
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
};

bool parse(const std::vector<std::string>& args, std::ostream& out, sim_options& o) {
  CLI::App app{"", "oobleck-sim"};
  app.footer(kAbout);
  add_text(app, "--profile", o.profile_path, "profile file (JSON or Cap'n Proto), e.g. oobleck-profile's output");
  add_text(app, "--model", o.model, "generate the profile of one of the paper's models instead")->type_name("NAME");
  add_text(app, "--trace", o.trace_path, "node availability trace (ms,add|remove,node)")->required();
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
           "profile Bamboo runs (default: --profile's; with --model, the model without activation checkpointing)");
  add_integer(app, "--gpus-per-node", o.gpus_per_node, 1, 1 << 10, "checked against the profile")->type_name("M");
  app.add_option("--policy", o.policy, "oobleck, varuna, bamboo or all (default)")
      ->type_name("NAME")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_text(app, "--recovery-costs", o.costs_path,
           "JSON of recovery constants (written by the fault-tolerance benchmark; default: documented defaults)");
  add_number(app, "--ready-delay-s", o.ready_delay_s, 0, "seconds from a node's add to its readiness (default 45)");
  add_number(app, "--time-scale", o.time_scale, 1e-9,
             "multiply trace times by X, e.g. 0.01 to compare with a local cluster replaying the trace 100x faster");
  add_number(app, "--duration-s", o.duration_s, 0, "simulated seconds from the trace's first time");
  add_number(app, "--state-factor", o.state_factor, 1e-9, "bytes of training state per parameter byte (default 4)");
  app.add_flag("--json", o.json, "print one JSON object instead of the report");
  add_text(app, "--plot", o.plot_path, "write a throughput-over-time PNG (needs gnuplot)")->type_name("OUT.png");
  if (!parse_flags(app, args, out)) return false;
  if (o.profile_path.empty() == o.model.empty()) throw input_error("give exactly one of --profile and --model (see --help)");
  if (o.policy != "all" && o.policy != "oobleck" && o.policy != "varuna" && o.policy != "bamboo")
    throw input_error("--policy must be oobleck, varuna, bamboo or all, got '" + o.policy + "'");
  if (!o.model.empty() && !o.bamboo_profile_path.empty())
    throw input_error("--bamboo-profile goes with --profile, not --model");
  if (o.profile_path.empty() == false)
    for (const auto& [flag, v] : {std::pair{"--global-batch", o.global_batch}, std::pair{"--microbatch", o.microbatch}})
      if (!v) throw input_error(std::string(flag) + " is required with --profile (see --help)");
  return true;
}

/// The profiles every policy runs, from the flags.
sim::sim_job make_job(const sim_options& o) {
  sim::sim_job job;
  job.fault_tolerance = *o.fault_tolerance;
  job.state_factor = o.state_factor;
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
    const auto recovery = o.costs_path.empty() ? sim::recovery_costs{} : sim::read_recovery_costs(o.costs_path);
    const auto events = sim::read_trace(o.trace_path);
    const auto trace = sim::to_cluster_trace(
        events, {.ready_delay_ms = o.ready_delay_s * 1e3, .time_scale = o.time_scale, .initial_nodes_ready = true});
    if (trace.most_alive == 0) throw input_error(o.trace_path + ": no node is ever ready");
    sim::sim_job job = make_job(o);
    job.nodes = o.nodes.value_or(trace.most_alive);
    const double end_ms = o.duration_s >= 0 ? trace.start_ms + o.duration_s * 1e3 : trace.end_ms;

    std::vector<std::unique_ptr<sim::policy>> policies;
    if (o.policy == "all" || o.policy == "oobleck")
      policies.push_back(std::make_unique<sim::oobleck_policy>(job, recovery, trace.start_ms));
    if (o.policy == "all" || o.policy == "varuna")
      policies.push_back(std::make_unique<sim::varuna_policy>(job, recovery, trace.start_ms));
    if (o.policy == "all" || o.policy == "bamboo")
      policies.push_back(std::make_unique<sim::bamboo_policy>(job, recovery, trace.start_ms));
    std::vector<sim::policy_result> results;
    for (auto& p : policies) results.push_back(sim::simulate(*p, trace, end_ms, job.nodes));

    const sim::run_description d{.model = job.profile.model, .trace = o.trace_path, .nodes = job.nodes,
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
