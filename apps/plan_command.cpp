#include "apps/plan_command.hpp"

#include <chrono>
#include <limits>
#include <new>
#include <optional>
#include <set>
#include <sstream>

#include "apps/flags.hpp"
#include "apps/plan_report.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::apps {

namespace {

using planning::planning_error;

constexpr const char* kAbout = R"(Plans an Oobleck job from a per-layer profile (JSON or Cap'n Proto, as written by oobleck-profile):
pipeline templates for every node count in [n0, n_max], the instantiation on N nodes with the
global batch split across pipelines, and the reaction to node failures and joins. --profile,
--nodes, --fault-tolerance, --global-batch and --microbatch are required, except that
--template-nodes needs only --profile. Events (--fail, --join) apply in the order given.

Exit status: 0 on success, 2 on bad input (one "error: ..." line), 1 on an internal failure.)";

struct plan_options {
  std::string profile_path;
  planning::job_config job;
  std::optional<int> gpus_per_node;
  std::optional<int> template_nodes;
  std::vector<std::pair<std::vector<int>, int>> events;  // (lost ids, joined count)
  bool json = false;
};

/// The flags; false when --help was asked.
bool parse(const std::vector<std::string>& args, std::ostream& out, plan_options& o) {
  CLI::App app{"", "oobleck-plan"};
  app.footer(kAbout);
  add_text(app, "--profile", o.profile_path, "profile file (JSON or Cap'n Proto)")->type_name("FILE")->required();
  auto* nodes = add_integer(app, "--nodes", o.job.nodes, 1, 1 << 20, "nodes at the start; they get ids 0..N-1")
                    ->type_name("N");
  auto* f = add_integer(app, "--fault-tolerance", o.job.fault_tolerance, 0, 1 << 20,
                        "simultaneous failures to survive (>= F+1 pipelines)")
                ->type_name("F");
  auto* b = add_integer(app, "--global-batch", o.job.global_batch, 1, 1 << 30, "samples per step (a multiple of b)")
                ->type_name("B");
  auto* mb = add_integer(app, "--microbatch", o.job.microbatch, 1, 1 << 30,
                         "samples per microbatch; must match the profile")
                 ->type_name("b");
  add_integer(app, "--gpus-per-node", o.gpus_per_node, 1, 1 << 10,
              "checked against the profile (a profile measured for another M is refused)")
      ->type_name("M");
  add_integer(app, "--device-memory", o.job.device_memory_bytes, 1, std::numeric_limits<std::int64_t>::max(),
              "plan for this much memory per GPU instead of the profile's")
      ->type_name("BYTES");
  add_number(app, "--state-factor", o.job.state_factor, 1e-9,
             "bytes of training state per parameter byte (default 4: weights, grads, two Adam moments)");
  add_integer(app, "--plan-memory-limit", o.job.plan_memory_limit_bytes, 0, std::numeric_limits<std::int64_t>::max(),
              "memory the template generator may use (default 1 GiB = 1073741824; 0: no limit); a larger "
              "planning problem is refused at once, saying how much it needs")
      ->type_name("BYTES");
  add_integer(app, "--template-nodes", o.template_nodes, 1, 1 << 16,
              "only generate the template for n nodes (needs only --profile)")
      ->type_name("n");
  app.add_option_function<std::string>(
         "--fail", [&](const std::string& ids) { o.events.push_back({parse_id_list("--fail", ids), 0}); },
         "a failure event: comma-separated node ids lost at once (repeatable)")
      ->type_name("IDS")
      ->trigger_on_parse();
  add_integer(app, "--join", 1, 1 << 16, [&](std::int64_t k) { o.events.push_back({{}, static_cast<int>(k)}); },
              "a join event: K new nodes, given the next unused ids (repeatable)")
      ->type_name("K")
      ->trigger_on_parse();
  app.add_flag("--json", o.json, "print one JSON object instead of the report");
  if (!parse_flags(app, args, out)) return false;
  if (o.template_nodes) return true;
  for (const auto* opt : {nodes, f, b, mb})
    if (opt->count() == 0) throw messages::input_error(opt->get_name() + " is required (see --help)");
  return true;
}

int template_only(const plan_options& o, const planning::profile& prof, std::ostream& out) {
  if (*o.template_nodes > prof.num_layers())
    throw planning_error("a pipeline of " + std::to_string(*o.template_nodes) + " nodes needs at least as many stages, "
                         "but the model has " + std::to_string(prof.num_layers()) + " layers");
  const planning::layer_costs costs(prof, planning::job_memory(prof, o.job));
  planning::template_generator gen(costs, {.memory_limit_bytes = o.job.plan_memory_limit_bytes});
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
    for (int n : o.events[i].first) {
      if (!alive.count(n))
        throw planning_error("event " + std::to_string(i + 1) + ": node " + std::to_string(n) + " is not alive");
      e.lost.push_back(planning::node_id{n});
    }
    if (std::set<planning::node_id>(e.lost.begin(), e.lost.end()).size() != e.lost.size())
      throw planning_error("event " + std::to_string(i + 1) + ": a node id is listed twice");
    for (int k = 0; k < o.events[i].second; ++k) e.joined.push_back(planning::node_id{next_id++});
    e.result = planning::reconfigure(ctx, state, e.lost, e.joined);
    for (int n : o.events[i].first) alive.erase(n);
    for (int k = 0; k < o.events[i].second; ++k) alive.insert(next_id - o.events[i].second + k);
    state = {e.result.pipelines, e.result.idle_nodes};
    const bool stop = e.result.action == planning::reconfiguration_action::checkpoint_and_stop;
    events.push_back(std::move(e));
    if (stop) break;  // the job has checkpointed and exited; later events never happen
  }
  return events;
}

}  // namespace

int run_plan_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return exit_status_of(err, [&] {
    plan_options o;
    if (!parse(args, out, o)) return 0;
    try {
      const planning::profile prof = messages::read_profile_file(o.profile_path);
      planning::check_matches(prof, {.microbatch_size = o.template_nodes ? std::nullopt : std::optional(o.job.microbatch),
                                     .gpus_per_node = o.gpus_per_node});
      if (o.template_nodes) return template_only(o, prof, out);
      const planning::job_plan plan = planning::plan_job(prof, o.job);
      const auto events = replay(o, prof, plan);
      if (o.json) out << json_line(plan_to_json(plan, events, o.job.global_batch)) << "\n";
      else print_plan(out, prof, o.job, plan, events);
      return 0;
    } catch (const std::bad_alloc&) {
      throw planning_error("the planning problem is too large for this machine's memory (fewer nodes, layers or "
                           "GPUs per node)");
    }
  });
}

}  // namespace oobleck::apps
