#pragma once
// The whole planning step of a job: node specification, templates, initial instantiation.

#include <cstdint>
#include <optional>
#include <vector>

#include <span>

#include "planning/cost_model.hpp"
#include "planning/ids.hpp"
#include "planning/instantiation.hpp"
#include "planning/node_spec.hpp"
#include "planning/pipeline_template.hpp"
#include "planning/profile.hpp"

namespace oobleck::planning {

struct job_config {
  int nodes = 0;            ///< N
  int fault_tolerance = 0;  ///< f
  int global_batch = 0;     ///< B
  int microbatch = 0;       ///< b
  double state_factor = 4.0;
  std::optional<std::int64_t> device_memory_bytes;  ///< overrides the profile's
  /// Memory the template generator may use (0: no limit); a larger planning problem is refused at
  /// once with planning_error saying how much it needs (planning_memory_bytes).
  std::uint64_t plan_memory_limit_bytes = kDefaultPlanningMemoryBytes;
};

/// The templates of a job, one per feasible node count in [n0, n_max], ascending.
struct template_set {
  std::vector<pipeline_template> templates;
  const pipeline_template* find(int nodes) const;
  std::vector<template_option> options() const;
  std::vector<int> sizes() const;
};

/// A running pipeline: its nodes (stable ids, in stage order) and the template it instantiates.
struct pipeline_instance {
  std::vector<node_id> nodes;
  int template_nodes = 0;
  int microbatches = 0;
  double time_ms = 0;
};

struct job_plan {
  node_specification spec;
  template_set templates;
  int num_microbatches = 0;
  std::vector<pipeline_instance> pipelines;
  std::vector<node_id> idle_nodes;  ///< alive but unused: the count has no exact cover
  /// Predicted step: the slowest pipeline's time plus synchronisation_ms of the pipelines.
  double step_ms = 0;
};

/// Memory model of a job: the profile's device memory unless the job overrides it.
memory_model job_memory(const profile& p, const job_config& job);

/// Plans a job end to end on nodes 0 .. job.nodes-1; throws planning_error with one line for the
/// user on impossible input.
job_plan plan_job(const profile& p, const job_config& job);
/// The same on the nodes `nodes` (job.nodes is their count): pipelines and idle nodes name them.
job_plan plan_job(const profile& p, const job_config& job, std::span<const node_id> nodes);

/// The part of a step after the pipelines' schedules, predicted from the profile: every node
/// all-reduces the gradient of each layer it holds over the layer's holders (one per pipeline:
/// layer_costs::allreduce_ms) and applies AdamW to it (optimizer_ms), one layer after another;
/// nodes do this at once, so the slowest node's sum counts. Not discounted for the overlap of the
/// all-reduce with the last backward. The instantiation is chosen on the pipelines' times alone
/// (ARCHITECTURE.md §4); predicted step times add this. 0 for a profile without link and optimizer costs.
double synchronisation_ms(const layer_costs& costs, const template_set& templates,
                          const std::vector<pipeline_instance>& pipelines);
/// The same for the nodes of one pipeline of template `t` when each of its layers has `holders`
/// holders: the slowest node's all-reduce and AdamW over its layers.
double template_synchronisation_ms(const layer_costs& costs, const pipeline_template& t, int holders);

/// Places instantiated pipelines on node ids in order; ids left over become idle.
std::vector<pipeline_instance> place_pipelines(const instantiation& inst, std::span<const node_id> node_ids);

/// Best instantiation of `nodes` nodes, or of the largest coverable count below it (the rest idle).
/// Throws planning_error (with the nearest distributable global batch where that is the cause).
instantiation instantiate_or_shrink(const template_set& templates, int nodes, int min_pipelines, int num_microbatches,
                                    int microbatch_size, int* used_nodes);

}  // namespace oobleck::planning
