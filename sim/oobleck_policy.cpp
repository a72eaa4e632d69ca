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
  if (started_once_) clock_.pause(activity::restart, restart_ms(rc_, state_bytes_));
  // As the planner predicts a step (planning::plan_job, and reconfigure after each change): the
  // slowest pipeline plus the gradient all-reduce and optimizer that follow it.
  const double step_ms =
      scaled(inst.batch.step_ms + planning::synchronisation_ms(*costs_, *templates_, state_.pipelines), used);
  clock_.run({.step_ms = step_ms, .samples_per_step = static_cast<double>(job_.global_batch), .nodes = used});
  record(started_once_ ? "restart" : "start", used, step_ms,
         std::to_string(state_.pipelines.size()) + " pipelines");
  running_ = true;
  started_once_ = true;
}

void oobleck_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  for (int n : removed) alive_.erase(n);
  alive_.insert(ready.begin(), ready.end());
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
  if (r.action == planning::reconfiguration_action::checkpoint_and_stop) {
    const bool enough = static_cast<int>(alive_.size()) >= (job_.fault_tolerance + 1) * n0_;
    if (enough) {
      // A layer lost every holder: nothing to checkpoint from; back to the last durable state.
      clock_.fall_back_to_checkpoint();
    } else {
      clock_.pause(activity::checkpoint, checkpoint_ms(rc_, state_bytes_));
    }
    record("stop", 0, 0, r.reason);
    state_ = {};
    running_ = false;
    start();
    return;
  }
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
