#include "sim/oobleck_policy.hpp"

#include <algorithm>
#include <map>

#include "planning/batch_distribution.hpp"
#include "planning/node_spec.hpp"
#include "planning/pipeline_template.hpp"
#include "planning/planner.hpp"

namespace oobleck::sim {

oobleck_policy::oobleck_policy(const sim_job& job, const recovery_costs& costs, double start_ms)
    : policy(start_ms), job_(job), rc_(costs) {
  planned_ = job.templates ? job.templates : plan_templates(job);
  costs_ = planned_->costs.get();
  templates_ = &planned_->templates;
  n0_ = planned_->n0;
  num_microbatches_ = planning::microbatches_per_step(job.global_batch, job.microbatch);
  if (num_microbatches_ < job.fault_tolerance + 1)
    throw planning::planning_error("global batch " + std::to_string(job.global_batch) + " gives " +
                                   std::to_string(num_microbatches_) + " microbatches for at least " +
                                   std::to_string(job.fault_tolerance + 1) +
                                   " pipelines; nearest distributable global batch: " +
                                   std::to_string((job.fault_tolerance + 1) * job.microbatch));
  state_bytes_ = state_bytes(job_.profile, job.state_factor);
}

int oobleck_policy::nodes_in_use() const {
  int n = 0;
  for (const auto& p : state_.pipelines) n += static_cast<int>(p.nodes.size());
  return n;
}

double oobleck_policy::scaled(double step_ms, int nodes) const {
  const auto n = static_cast<std::size_t>(nodes);
  return n < job_.step_scale.size() && job_.step_scale[n] > 0 ? step_ms * job_.step_scale[n] : step_ms;
}

double oobleck_policy::copy_ms(const std::vector<planning::layer_copy>& copies) const {
  std::map<planning::node_id, double> in, out;
  double busiest = 0;
  for (const auto& c : copies) {
    busiest = std::max(busiest, in[c.to_node] += static_cast<double>(c.bytes));
    busiest = std::max(busiest, out[c.from_node] += static_cast<double>(c.bytes));
  }
  return busiest / rc_.copy_bytes_per_s * 1e3;
}

double oobleck_policy::checkpoint_resume_ms() const {
  // The workers stay up and load their layers from the checkpoint: the new epoch (planning_ms,
  // measured by bench/recovery for the local cluster, bench/results/recovery.json) and the state
  // read at load_bytes_per_s (a documented default, sim/recovery_costs.hpp: bench/recovery
  // measures no load). No restart_fixed_ms: no process restarts.
  return rc_.planning_ms + state_bytes_ / rc_.load_bytes_per_s * 1e3;
}

bool oobleck_policy::every_layer_held() const {
  std::vector<bool> held(static_cast<std::size_t>(costs_->num_layers()), false);
  const std::set<planning::node_id> lost(lost_since_formed_.begin(), lost_since_formed_.end());
  for (const auto& p : formed_.pipelines) {
    const auto* t = templates_->find(p.template_nodes);
    if (!t) return false;
    for (std::size_t pos = 0; pos < p.nodes.size(); ++pos) {
      if (lost.count(p.nodes[pos])) continue;
      const auto [u, v] = t->node_layers(static_cast<int>(pos));
      for (int l = u.value; l < v.value; ++l) held[static_cast<std::size_t>(l)] = true;
    }
  }
  return std::all_of(held.begin(), held.end(), [](bool h) { return h; });
}

void oobleck_policy::start() {
  const int min_nodes = (job_.fault_tolerance + 1) * n0_;
  if (static_cast<int>(alive_.size()) < min_nodes) {
    clock_.stop();
    record("wait", 0, 0, std::to_string(alive_.size()) + " nodes ready, " + std::to_string(min_nodes) + " needed");
    return;
  }
  int used = 0;
  const auto inst = planning::instantiate_or_shrink(*templates_, static_cast<int>(alive_.size()),
                                                    job_.fault_tolerance + 1, num_microbatches_, job_.microbatch, &used);
  const std::vector<planning::node_id> ids = planning::node_ids(alive_);
  state_.pipelines = planning::place_pipelines(inst, ids);
  state_.idle_nodes.assign(ids.begin() + used, ids.end());
  if (started_once_) clock_.pause(activity::restart, checkpoint_resume_ms());
  // As the planner predicts a step (planning::plan_job, and reconfigure after each change): the
  // slowest pipeline plus the gradient all-reduce and optimizer that follow it.
  const double step_ms =
      scaled(inst.batch.step_ms + planning::synchronisation_ms(*costs_, *templates_, state_.pipelines), used);
  clock_.run({.step_ms = step_ms, .samples_per_step = static_cast<double>(job_.global_batch), .nodes = used});
  record(started_once_ ? "restart" : "start", used, step_ms,
         std::to_string(state_.pipelines.size()) + " pipelines" + (started_once_ ? " (from the checkpoint)" : ""));
  running_ = true;
  started_once_ = true;
  waiting_ = false;
}

void oobleck_policy::stop(const std::vector<planning::node_id>& lost, const std::vector<planning::node_id>& joined,
                          const std::string& reason) {
  formed_ = state_;
  lost_since_formed_ = lost;
  joined_since_formed_ = joined;
  memory_ = every_layer_held();
  checkpointed_ = false;
  if (!memory_) {
    // A layer lost every holder: nothing to checkpoint from; back to the last durable state.
    clock_.fall_back_to_checkpoint();
  } else if (job_.checkpoint_folder) {
    clock_.pause(activity::checkpoint, checkpoint_ms(rc_, state_bytes_));
    checkpointed_ = true;
  }
  record("stop", 0, 0, reason);
  state_ = {};
  running_ = false;
  waiting_ = true;
  const int need = (job_.fault_tolerance + 1) * n0_;
  if (static_cast<int>(alive_.size()) < need)
    record("wait", 0, 0, std::to_string(alive_.size()) + " nodes, " + std::to_string(need) + " needed");
  try_resume();
}

void oobleck_policy::try_resume() {
  if (static_cast<int>(alive_.size()) < (job_.fault_tolerance + 1) * n0_) {
    clock_.stop();
    return;
  }
  if (memory_) {
    const planning::reconfiguration_context ctx{*templates_, *costs_, job_.fault_tolerance, num_microbatches_,
                                                job_.microbatch};
    const auto r = planning::reconfigure(ctx, formed_, lost_since_formed_, joined_since_formed_);
    if (r.action == planning::reconfiguration_action::continue_training) {
      // As the coordinator resumes from its survivors' memory: the reconfiguration policy over the
      // last formed configuration with every loss and join since, then the layer copies.
      clock_.pause(activity::reconfiguration, rc_.planning_ms + copy_ms(r.copies));
      state_ = {r.pipelines, r.idle_nodes};
      const int used = nodes_in_use();
      const double step_ms = scaled(r.step_ms, used);
      clock_.run({.step_ms = step_ms, .samples_per_step = static_cast<double>(job_.global_batch), .nodes = used});
      std::string rules;
      for (auto rule : r.rules) rules += (rules.empty() ? "" : ",") + std::string(planning::to_string(rule));
      record("resume", used, step_ms, "from memory: " + rules);
      running_ = true;
      waiting_ = false;
      return;
    }
    memory_ = false;
    if (!checkpointed_) clock_.fall_back_to_checkpoint();
  }
  start();
}

void oobleck_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  for (int n : removed) alive_.erase(n);
  alive_.insert(ready.begin(), ready.end());
  if (waiting_) {
    std::set<planning::node_id> formed(formed_.idle_nodes.begin(), formed_.idle_nodes.end());
    for (const auto& p : formed_.pipelines) formed.insert(p.nodes.begin(), p.nodes.end());
    for (int n : removed) {
      const planning::node_id id{n};
      if (formed.count(id)) lost_since_formed_.push_back(id);
      std::erase(joined_since_formed_, id);
    }
    for (int n : ready)
      if (!formed.count(planning::node_id{n})) joined_since_formed_.push_back(planning::node_id{n});
    if (memory_ && !every_layer_held()) {
      // The last holder of a layer went while the job waited: only the checkpoint is left (the one
      // written at the stop; without one, the progress since the last durable point is lost).
      memory_ = false;
      if (!checkpointed_) clock_.fall_back_to_checkpoint();
    }
    try_resume();
    return;
  }
  if (!running_) {
    start();
    return;
  }
  std::vector<planning::node_id> lost;
  std::set<planning::node_id> in_config;
  for (const auto& p : state_.pipelines) in_config.insert(p.nodes.begin(), p.nodes.end());
  in_config.insert(state_.idle_nodes.begin(), state_.idle_nodes.end());
  for (int n : removed)
    if (in_config.count(planning::node_id{n})) lost.push_back(planning::node_id{n});
  if (lost.empty() && ready.empty()) return;
  if (!lost.empty()) {
    clock_.interrupt();  // the step in progress is lost; it re-runs in the next epoch
    clock_.pause(activity::reconfiguration, rc_.detection_ms);
  } else {
    clock_.finish_step();  // joins enter at a step boundary
  }
  const planning::reconfiguration_context ctx{*templates_, *costs_, job_.fault_tolerance, num_microbatches_,
                                              job_.microbatch};
  const auto r = planning::reconfigure(ctx, state_, lost, planning::node_ids(ready));
  if (r.action == planning::reconfiguration_action::checkpoint_and_stop)
    return stop(lost, planning::node_ids(ready), r.reason);
  clock_.pause(activity::reconfiguration, rc_.planning_ms + copy_ms(r.copies));
  state_ = {r.pipelines, r.idle_nodes};
  const int used = nodes_in_use();
  const double step_ms = scaled(r.step_ms, used);
  clock_.run({.step_ms = step_ms, .samples_per_step = static_cast<double>(job_.global_batch), .nodes = used});
  std::string rules;
  for (auto rule : r.rules) rules += (rules.empty() ? "" : ",") + std::string(planning::to_string(rule));
  record("reconfigure", used, step_ms, rules);
}

}  // namespace oobleck::sim
