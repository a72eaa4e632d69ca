#include "sim/checkpoint_restart_policy.hpp"

#include <algorithm>
#include <cmath>

#include "planning/batch_distribution.hpp"

namespace oobleck::sim {

grid fastest_template_grid(const job_templates& t, int nodes, int num_microbatches) {
  std::vector<std::optional<planning::pipeline_template>> layouts;
  for (const auto& tmpl : t.templates.templates) {
    if (tmpl.nodes >= static_cast<int>(layouts.size())) layouts.resize(tmpl.nodes + 1);
    layouts[tmpl.nodes] = tmpl;
  }
  return fastest_grid(layouts, nodes, num_microbatches, *t.costs);
}

fixed_grid plan_fixed_grid(const sim_job& job) {
  fixed_grid out;
  out.planned = job.templates ? job.templates : plan_templates(job);
  const int microbatches = planning::microbatches_per_step(job.global_batch, job.microbatch);
  out.shape = fastest_template_grid(*out.planned, job.nodes, microbatches);
  if (out.shape.depth == 0)
    out.never_runs = "no grid of the job's templates fits on " + std::to_string(job.nodes) + " nodes";
  return out;
}

checkpoint_restart_policy::checkpoint_restart_policy(const sim_job& job, const recovery_costs& costs, double start_ms,
                                                     double mttf_ms)
    : policy(start_ms), job_(job), rc_(costs) {
  auto fixed = plan_fixed_grid(job);
  planned_ = std::move(fixed.planned);
  grid_ = fixed.shape;
  if (!fixed.never_runs.empty()) {
    never_runs_ = std::move(fixed.never_runs);
    return;
  }
  const double state = state_bytes(job.profile, job.state_factor);
  const double gpus = static_cast<double>(grid_.depth) * std::max(job.profile.gpus_per_node, 1);
  snapshot_ms_ = state / gpus / rc_.snapshot_bytes_per_s * 1e3;
  write_ms_ = rc_.checkpoint_fixed_ms + state / rc_.storage_bytes_per_s * 1e3;
  if (rc_.checkpoint_interval_s > 0) interval_ms_ = rc_.checkpoint_interval_s * 1e3;
  else if (mttf_ms > 0) interval_ms_ = std::sqrt(2 * snapshot_ms_ * mttf_ms);
  else interval_ms_ = 30 * 60e3;
  interval_ms_ = std::max(interval_ms_, write_ms_);
  restart_ms_ = sim::restart_ms(rc_, state);
}

void checkpoint_restart_policy::launch(bool restart) {
  in_use_.clear();
  if (static_cast<int>(alive_.size()) < grid_.nodes()) {
    clock_.stop();
    running_ = false;
    record("wait", 0, 0, std::to_string(alive_.size()) + " nodes ready, " + std::to_string(grid_.nodes()) + " needed");
    return;
  }
  auto it = alive_.begin();
  for (int i = 0; i < grid_.nodes(); ++i) in_use_.insert(*it++);
  if (restart) clock_.pause(activity::restart, restart_ms_);
  clock_.run({.step_ms = grid_.step_ms, .samples_per_step = static_cast<double>(job_.global_batch),
              .nodes = grid_.nodes()});
  const int every = std::max(1, static_cast<int>(std::lround(interval_ms_ / grid_.step_ms)));
  clock_.checkpoint_every(every, snapshot_ms_, write_ms_);
  record(restart ? "restart" : "start", grid_.nodes(), grid_.step_ms,
         std::to_string(grid_.pipelines) + " x " + std::to_string(grid_.depth) + ", checkpoint every " +
             std::to_string(every) + " steps");
  running_ = true;
  started_once_ = true;
}

void checkpoint_restart_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  for (int n : removed) alive_.erase(n);
  alive_.insert(ready.begin(), ready.end());
  if (grid_.depth == 0) return;
  if (!running_) {
    launch(started_once_);
    return;
  }
  const bool lost = std::any_of(removed.begin(), removed.end(), [&](int n) { return in_use_.count(n) > 0; });
  if (!lost) return;  // joins wait as spares; a spare lost costs nothing
  clock_.interrupt();
  clock_.fall_back_to_checkpoint();
  clock_.pause(activity::restart, rc_.detection_ms);
  launch(true);
}

}  // namespace oobleck::sim
