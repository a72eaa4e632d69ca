#include "sim/policy.hpp"

#include <algorithm>

#include "planning/pipeline_template.hpp"

namespace oobleck::sim {

std::shared_ptr<const job_templates> plan_templates(const sim_job& job) {
  planning::validate(job.profile);
  auto t = std::make_shared<job_templates>();
  planning::job_config config{.nodes = job.nodes, .fault_tolerance = job.fault_tolerance,
                              .global_batch = job.global_batch, .microbatch = job.microbatch,
                              .state_factor = job.state_factor};
  t->costs = std::make_unique<planning::layer_costs>(job.profile, planning::job_memory(job.profile, config));
  planning::template_generator generator(*t->costs);
  const auto feasible = generator.feasible_node_counts(std::min(job.profile.num_layers(), job.nodes));
  const auto spec = planning::specify_nodes(feasible, job.profile.num_layers(), job.nodes, job.fault_tolerance);
  t->n0 = spec.n0;
  t->n_max = job.max_template_nodes > 0 ? std::max(spec.n0, std::min(spec.n_max, job.max_template_nodes)) : spec.n_max;
  for (auto& tmpl : generator.generate(spec.n0, t->n_max))
    if (tmpl) t->templates.templates.push_back(std::move(*tmpl));
  return t;
}

double state_bytes(const planning::profile& p, double state_factor) {
  double bytes = 0;
  for (const auto& l : p.layers) bytes += static_cast<double>(l.param_bytes);
  return bytes * state_factor;
}

double restart_ms(const recovery_costs& c, double bytes) { return c.restart_fixed_ms + bytes / c.load_bytes_per_s * 1e3; }

double checkpoint_ms(const recovery_costs& c, double bytes) {
  return c.checkpoint_fixed_ms + bytes / c.storage_bytes_per_s * 1e3;
}

}  // namespace oobleck::sim
