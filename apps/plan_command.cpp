#include "apps/plan_command.hpp"

#include <chrono>
#include <new>
#include <optional>
#include <set>
#include <sstream>

#include "apps/cli_args.hpp"
#include "apps/plan_report.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::apps {

namespace {

using planning::planning_error;

constexpr const char* kUsage = R"(usage: oobleck-plan --profile PATH --nodes N --fault-tolerance F --global-batch B --microbatch b
                    [--gpus-per-node M] [--device-memory BYTES] [--state-factor X]
                    [--template-nodes n] [--fail IDS]... [--join K]... [--json]

Plans an Oobleck job from a per-layer profile (JSON or Cap'n Proto, as written by oobleck-profile):
pipeline templates for every node count in [n0, n_max], the instantiation on N nodes with the
global batch split across pipelines, and the reaction to node failures and joins.

  --profile PATH         profile file (required)
  --nodes N              nodes at the start; they get ids 0..N-1
  --fault-tolerance F    simultaneous failures to survive (>= F+1 pipelines)
  --global-batch B       samples per step (a multiple of b)
  --microbatch b         samples per microbatch; must match the profile
  --gpus-per-node M      checked against the profile (a profile measured for another M is refused)
  --device-memory BYTES  plan for this much memory per GPU instead of the profile's
  --state-factor X       bytes of training state per parameter byte (default 4: weights, grads,
                         two Adam moments)
  --template-nodes n     only generate the template for n nodes (needs only --profile)
  --fail IDS             a failure event: comma-separated node ids lost at once (repeatable)
  --join K               a join event: K new nodes, given the next unused ids (repeatable)
  --json                 print one JSON object instead of the report
  --help                 this text

Events apply in the order given. Exit status: 0 on success, 2 on bad input.
)";

struct plan_options {
  std::string profile_path;
  planning::job_config job;
  std::optional<int> gpus_per_node;
  std::optional<int> template_nodes;
  std::vector<std::pair<std::vector<int>, int>> events;  // (lost ids, joined count)
  bool json = false;
};

plan_options parse(cli_args& a) {
  plan_options o;
  bool have_nodes = false, have_f = false, have_b = false, have_mb = false;
  while (a.more()) {
    const std::string flag = a.flag();
    if (flag == "--profile") o.profile_path = a.value(flag);
    else if (flag == "--nodes") o.job.nodes = a.integer(flag, 1, 1 << 20), have_nodes = true;
    else if (flag == "--fault-tolerance") o.job.fault_tolerance = a.integer(flag, 0, 1 << 20), have_f = true;
    else if (flag == "--global-batch") o.job.global_batch = a.integer(flag, 1, 1 << 30), have_b = true;
    else if (flag == "--microbatch") o.job.microbatch = a.integer(flag, 1, 1 << 30), have_mb = true;
    else if (flag == "--gpus-per-node") o.gpus_per_node = a.integer(flag, 1, 1 << 10);
    else if (flag == "--device-memory") o.job.device_memory_bytes = a.integer64(flag, 1);
    else if (flag == "--state-factor") o.job.state_factor = a.real(flag, 1e-9);
    else if (flag == "--template-nodes") o.template_nodes = a.integer(flag, 1, 1 << 16);
    else if (flag == "--fail") o.events.push_back({a.integer_list(flag), 0});
    else if (flag == "--join") o.events.push_back({{}, a.integer(flag, 1, 1 << 16)});
    else if (flag == "--json") o.json = true;
    else throw planning_error("unknown option " + flag + " (see --help)");
  }
  if (o.profile_path.empty()) throw planning_error("--profile is required (see --help)");
  if (o.template_nodes) return o;
  for (auto [given, name] : {std::pair{have_nodes, "--nodes"}, {have_f, "--fault-tolerance"},
                             {have_b, "--global-batch"}, {have_mb, "--microbatch"}})
    if (!given) throw planning_error(std::string(name) + " is required (see --help)");
  return o;
}

int template_only(const plan_options& o, const planning::profile& prof, std::ostream& out) {
  if (*o.template_nodes > prof.num_layers())
    throw planning_error("a pipeline of " + std::to_string(*o.template_nodes) + " nodes needs at least as many stages, "
                         "but the model has " + std::to_string(prof.num_layers()) + " layers");
  const planning::layer_costs costs(prof, planning::job_memory(prof, o.job));
  planning::template_generator gen(costs);
  const auto start = std::chrono::steady_clock::now();
  const auto t = gen.generate(*o.template_nodes);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!t)
    throw planning_error("no layout of " + std::to_string(*o.template_nodes) + " nodes fits the model in memory");
  if (o.json) {
    nlohmann::ordered_json doc = nlohmann::ordered_json::object();
    doc["templates"] = nlohmann::ordered_json::array({template_to_json(*t)});
    doc["planning_ms"] = ms;
    out << json_line(doc) << "\n";
  } else {
    out << "template for " << *o.template_nodes << " nodes (" << ms << " ms to plan):\n";
    print_template(out, *t);
  }
  return 0;
}

std::vector<plan_event> replay(const plan_options& o, const planning::profile& prof, const planning::job_plan& plan) {
  const planning::layer_costs costs(prof, planning::job_memory(prof, o.job));
  const planning::reconfiguration_context ctx{plan.templates, costs, o.job.fault_tolerance, plan.num_microbatches,
                                              o.job.microbatch};
  planning::cluster_state state{plan.pipelines, plan.idle_nodes};
  std::set<int> alive;
  for (int i = 0; i < o.job.nodes; ++i) alive.insert(i);
  int next_id = o.job.nodes;
  std::vector<plan_event> events;
  for (std::size_t i = 0; i < o.events.size(); ++i) {
    plan_event e;
    e.lost = o.events[i].first;
    for (int n : e.lost)
      if (!alive.count(n))
        throw planning_error("event " + std::to_string(i + 1) + ": node " + std::to_string(n) + " is not alive");
    if (std::set<int>(e.lost.begin(), e.lost.end()).size() != e.lost.size())
      throw planning_error("event " + std::to_string(i + 1) + ": a node id is listed twice");
    for (int k = 0; k < o.events[i].second; ++k) e.joined.push_back(next_id++);
    e.result = planning::reconfigure(ctx, state, e.lost, e.joined);
    for (int n : e.lost) alive.erase(n);
    alive.insert(e.joined.begin(), e.joined.end());
    state = {e.result.pipelines, e.result.idle_nodes};
    const bool stop = e.result.action == planning::reconfiguration_action::checkpoint_and_stop;
    events.push_back(std::move(e));
    if (stop) break;  // the job has checkpointed and exited; later events never happen
  }
  return events;
}

}  // namespace

int run_plan_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    cli_args a(args);
    if (a.wants_help()) {
      out << kUsage;
      return 0;
    }
    const plan_options o = parse(a);
    const planning::profile prof = messages::read_profile_file(o.profile_path);
    planning::check_matches(prof, {.microbatch_size = o.template_nodes ? std::nullopt : std::optional(o.job.microbatch),
                                   .gpus_per_node = o.gpus_per_node});
    if (o.template_nodes) return template_only(o, prof, out);
    const planning::job_plan plan = planning::plan_job(prof, o.job);
    const auto events = replay(o, prof, plan);
    if (o.json) out << json_line(plan_to_json(plan, events, o.job.global_batch)) << "\n";
    else print_plan(out, prof, o.job, plan, events);
    return 0;
  } catch (const planning_error& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  } catch (const messages::input_error& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    err << "error: the planning problem is too large for this machine's memory (fewer nodes, layers or GPUs "
           "per node)\n";
    return 2;
  }
}

}  // namespace oobleck::apps
