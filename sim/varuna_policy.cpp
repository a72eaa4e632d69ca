#include "sim/varuna_policy.hpp"

#include <algorithm>

#include "planning/batch_distribution.hpp"
#include "planning/cost_model.hpp"
#include "planning/planner.hpp"

namespace oobleck::sim {

grid fastest_grid(const std::vector<std::optional<planning::pipeline_template>>& layouts, int n, int num_microbatches,
                  const planning::layer_costs& costs) {
  grid best;
  for (int p = 1; p < static_cast<int>(layouts.size()) && p <= n; ++p) {
    if (!layouts[p]) continue;
    const int d = std::min(n / p, num_microbatches);
    if (d < 1) continue;
    const int per_pipeline = (num_microbatches + d - 1) / d;
    const double step = layouts[p]->time_ms(per_pipeline) + planning::template_synchronisation_ms(costs, *layouts[p], d);
    if (best.depth == 0 || step < best.step_ms) best = {p, d, step};
  }
  return best;
}

varuna_policy::varuna_policy(const sim_job& job, const recovery_costs& costs, double start_ms)
    : policy(start_ms), job_(job), rc_(costs) {
  planning::validate(job_.profile);
  num_microbatches_ = planning::microbatches_per_step(job.global_batch, job.microbatch);
  planning::job_config config{.nodes = job.nodes, .global_batch = job.global_batch, .microbatch = job.microbatch,
                              .state_factor = job.state_factor};
  const planning::layer_costs& costs_model = costs_.emplace(job_.profile, planning::job_memory(job_.profile, config));
  planning::template_generator generator(costs_model);
  const int most = std::min(job_.profile.num_layers(), job.nodes);
  layouts_.resize(most + 1);
  if (most >= 1) {
    auto all = generator.generate(1, most);
    for (int p = 1; p <= most; ++p) layouts_[p] = std::move(all[p - 1]);
  }
  state_bytes_ = state_bytes(job_.profile, job.state_factor);
  if (best_grid(job.nodes).depth == 0)
    never_runs_ = "out of memory: no layout of " + job_.profile.model + " fits on up to " + std::to_string(most) +
                  " nodes";
}

void varuna_policy::launch(bool restart) {
  grid_ = best_grid(static_cast<int>(alive_.size()));
  in_grid_.clear();
  if (grid_.depth == 0) {
    clock_.stop();
    running_ = false;
    record("wait", 0, 0, "no grid fits on " + std::to_string(alive_.size()) + " nodes");
    return;
  }
  auto it = alive_.begin();
  for (int i = 0; i < grid_.nodes(); ++i) in_grid_.insert(*it++);
  if (restart) clock_.pause(activity::restart, restart_ms(rc_, state_bytes_));
  clock_.run({.step_ms = grid_.step_ms, .samples_per_step = static_cast<double>(job_.global_batch),
              .nodes = grid_.nodes()});
  clock_.checkpoint_every(rc_.varuna_checkpoint_every_steps, checkpoint_ms(rc_, state_bytes_));
  record(restart ? "restart" : "start", grid_.nodes(), grid_.step_ms,
         std::to_string(grid_.pipelines) + " x " + std::to_string(grid_.depth));
  running_ = true;
  started_once_ = true;
}

void varuna_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  for (int n : removed) alive_.erase(n);
  alive_.insert(ready.begin(), ready.end());
  if (!running_) {
    launch(started_once_);
    return;
  }
  const bool lost = std::any_of(removed.begin(), removed.end(), [&](int n) { return in_grid_.count(n) > 0; });
  if (lost) {
    clock_.interrupt();
    clock_.fall_back_to_checkpoint();
    clock_.pause(activity::restart, rc_.detection_ms);
    launch(true);
    return;
  }
  if (ready.empty()) return;
  const grid better = best_grid(static_cast<int>(alive_.size()));
  if (better.depth == 0 || !(better.step_ms < grid_.step_ms)) return;  // the new nodes wait
  clock_.finish_step();
  clock_.pause(activity::checkpoint, checkpoint_ms(rc_, state_bytes_));
  launch(true);
  decisions_.back().what = "morph";
}

}  // namespace oobleck::sim
