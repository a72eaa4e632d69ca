#include "planning/planner.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "planning/batch_distribution.hpp"

namespace oobleck::planning {

const pipeline_template* template_set::find(int nodes) const {
  for (const auto& t : templates)
    if (t.nodes == nodes) return &t;
  return nullptr;
}

std::vector<template_option> template_set::options() const {
  std::vector<template_option> out;
  for (const auto& t : templates) out.push_back({t.nodes, t.time});
  return out;
}

std::vector<int> template_set::sizes() const {
  std::vector<int> out;
  for (const auto& t : templates) out.push_back(t.nodes);
  return out;
}

memory_model job_memory(const profile& p, const job_config& job) {
  const auto bytes = job.device_memory_bytes.value_or(p.device_memory_bytes);
  if (bytes <= 0) throw planning_error("device memory must be > 0 bytes, got " + std::to_string(bytes));
  if (!(job.state_factor > 0)) throw planning_error("state factor must be > 0");
  return {static_cast<double>(bytes), job.state_factor};
}

double synchronisation_ms(const layer_costs& costs, const template_set& templates,
                          const std::vector<pipeline_instance>& pipelines) {
  const int holders = static_cast<int>(pipelines.size());
  double slowest = 0;
  for (const auto& p : pipelines) {
    const auto* t = templates.find(p.template_nodes);
    if (!t) throw std::logic_error("no template of " + std::to_string(p.template_nodes) + " nodes");
    slowest = std::max(slowest, template_synchronisation_ms(costs, *t, holders));
  }
  return slowest;
}

double template_synchronisation_ms(const layer_costs& costs, const pipeline_template& t, int holders) {
  double slowest = 0;
  for (int node = 0; node < t.nodes; ++node) {
    const auto [u, v] = t.node_layers(node);
    slowest = std::max(slowest, costs.synchronisation_ms(u, v, holders));
  }
  return slowest;
}

std::vector<pipeline_instance> place_pipelines(const instantiation& inst, std::span<const node_id> node_ids) {
  std::vector<pipeline_instance> out;
  std::size_t next = 0;
  for (std::size_t i = 0; i < inst.template_nodes.size(); ++i) {
    pipeline_instance p;
    p.template_nodes = inst.template_nodes[i];
    p.nodes.assign(node_ids.begin() + next, node_ids.begin() + next + p.template_nodes);
    next += p.template_nodes;
    p.microbatches = inst.batch.microbatches[i];
    p.time_ms = inst.batch.time_ms[i];
    out.push_back(std::move(p));
  }
  return out;
}

instantiation instantiate_or_shrink(const template_set& templates, int nodes, int min_pipelines, int num_microbatches,
                                    int microbatch_size, int* used_nodes) {
  const auto options = templates.options();
  int smallest = nodes + 1;
  for (const auto& o : options) smallest = std::min(smallest, o.nodes);
  for (int n = nodes; n >= smallest * min_pipelines && n > 0; --n) {
    if (auto inst = instantiate(options, n, min_pipelines, num_microbatches)) {
      if (used_nodes) *used_nodes = n;
      return *inst;
    }
    // Covered, but only by more pipelines than there are microbatches: a batch problem, say so.
    if (auto fewest = fewest_pipelines(options, n, min_pipelines); fewest && *fewest > num_microbatches)
      throw planning_error("global batch " + std::to_string(num_microbatches * microbatch_size) + " gives " +
                           std::to_string(num_microbatches) + " microbatches, but using " + std::to_string(n) +
                           " nodes takes at least " + std::to_string(*fewest) +
                           " pipelines of one microbatch each; nearest distributable global batch: " +
                           std::to_string(*fewest * microbatch_size));
  }
  if (num_microbatches < min_pipelines)
    throw planning_error("global batch " + std::to_string(num_microbatches * microbatch_size) + " gives " +
                         std::to_string(num_microbatches) + " microbatches for at least " +
                         std::to_string(min_pipelines) +
                         " pipelines; nearest distributable global batch: " +
                         std::to_string(min_pipelines * microbatch_size));
  throw planning_error("no combination of >= " + std::to_string(min_pipelines) + " pipelines covers " +
                       std::to_string(nodes) + " nodes or fewer");
}

job_plan plan_job(const profile& p, const job_config& job) {
  std::vector<node_id> ids;
  for (int i = 0; i < job.nodes; ++i) ids.push_back(node_id{i});
  return plan_job(p, job, ids);
}

job_plan plan_job(const profile& p, const job_config& job, std::span<const node_id> ids) {
  if (static_cast<int>(ids.size()) != job.nodes)
    throw planning_error("a job of " + std::to_string(job.nodes) + " nodes planned on " + std::to_string(ids.size()) +
                         " node ids");
  validate(p);
  const layer_costs costs(p, job_memory(p, job));
  job_plan plan;
  plan.num_microbatches = microbatches_per_step(job.global_batch, job.microbatch);
  template_generator generator(costs, {.memory_limit_bytes = job.plan_memory_limit_bytes});
  const auto feasible = generator.feasible_node_counts(std::min(p.num_layers(), job.nodes));
  plan.spec = specify_nodes(feasible, p.num_layers(), job.nodes, job.fault_tolerance);
  for (auto& t : generator.generate(plan.spec.n0, plan.spec.n_max))
    if (t) plan.templates.templates.push_back(std::move(*t));
  int used = 0;
  const auto inst = instantiate_or_shrink(plan.templates, job.nodes, job.fault_tolerance + 1, plan.num_microbatches,
                                          job.microbatch, &used);
  plan.pipelines = place_pipelines(inst, ids);
  plan.idle_nodes.assign(ids.begin() + used, ids.end());
  plan.step_ms = inst.batch.step_ms + synchronisation_ms(costs, plan.templates, plan.pipelines);
  return plan;
}

}  // namespace oobleck::planning
