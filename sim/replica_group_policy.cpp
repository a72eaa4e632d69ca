#include "sim/replica_group_policy.hpp"

#include <algorithm>
#include <limits>

#include "planning/batch_distribution.hpp"
#include "sim/checkpoint_restart_policy.hpp"

namespace oobleck::sim {

replica_group_policy::replica_group_policy(const sim_job& job, const recovery_costs& costs, double start_ms)
    : policy(start_ms), job_(job), rc_(costs) {
  auto fixed = plan_fixed_grid(job);
  planned_ = std::move(fixed.planned);
  grid_ = fixed.shape;
  if (!fixed.never_runs.empty()) {
    never_runs_ = std::move(fixed.never_runs);
    return;
  }
  heal_ms_ = state_bytes(job.profile, job.state_factor) / grid_.depth / rc_.copy_bytes_per_s * 1e3;
}

int replica_group_policy::training() const {
  return static_cast<int>(
      std::count_if(groups_.begin(), groups_.end(), [](const group& g) { return g.state == group_state::training; }));
}

double replica_group_policy::next_timer_ms() const {
  double t = std::numeric_limits<double>::infinity();
  for (const auto& g : groups_)
    if (g.state == group_state::starting) t = std::min(t, g.ready_ms);
  return t;
}

void replica_group_policy::form_groups() {
  // At the very start every group trains at once; later each new group starts up first.
  const int most = grid_.pipelines + rc_.spare_groups;
  while (static_cast<int>(pool_.size()) >= grid_.depth && static_cast<int>(groups_.size()) < most) {
    group g;
    g.nodes.assign(pool_.begin(), pool_.begin() + grid_.depth);
    pool_.erase(pool_.begin(), pool_.begin() + grid_.depth);
    if (!started_once_ && static_cast<int>(groups_.size()) < grid_.pipelines) {
      g.state = group_state::training;
    } else {
      g.state = group_state::starting;
      g.ready_ms = clock_.now() + rc_.restart_fixed_ms + heal_ms_;
    }
    groups_.push_back(std::move(g));
  }
}

void replica_group_policy::retrain(bool failure) {
  const int n = training();
  if (n == 0) {
    clock_.stop();
    record("wait", 0, 0, "no replica group training");
    return;
  }
  const double samples = static_cast<double>(job_.global_batch) * n / grid_.pipelines;
  clock_.run({.step_ms = grid_.step_ms, .samples_per_step = samples, .nodes = n * grid_.depth});
  record(!started_once_ ? "start" : failure ? "shrink" : "grow", n * grid_.depth, grid_.step_ms,
         std::to_string(n) + " of " + std::to_string(grid_.pipelines) + " groups x " + std::to_string(grid_.depth));
  started_once_ = true;
}

void replica_group_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  if (grid_.depth == 0) return;
  bool lost_training = false;
  for (int n : removed) {
    const auto in_pool = std::find(pool_.begin(), pool_.end(), n);
    if (in_pool != pool_.end()) {
      pool_.erase(in_pool);
      continue;
    }
    for (auto g = groups_.begin(); g != groups_.end(); ++g) {
      if (std::find(g->nodes.begin(), g->nodes.end(), n) == g->nodes.end()) continue;
      lost_training |= g->state == group_state::training;
      for (int m : g->nodes)
        if (m != n && std::find(removed.begin(), removed.end(), m) == removed.end()) pool_.push_back(m);
      groups_.erase(g);
      break;
    }
  }
  pool_.insert(pool_.end(), ready.begin(), ready.end());
  if (lost_training) {
    // A warm group takes a lost one's place after copying the current state.
    const int missing = grid_.pipelines - training();
    int woken = 0;
    for (auto& g : groups_)
      if (g.state == group_state::warm && woken < missing) {
        g.state = group_state::starting;
        g.ready_ms = clock_.now() + rc_.detection_ms + rc_.planning_ms + heal_ms_;
        ++woken;
      }
  }
  const bool first = !started_once_;
  form_groups();
  if (first) {
    retrain(false);
    return;
  }
  if (lost_training) {
    clock_.interrupt();
    clock_.pause(activity::reconfiguration, rc_.detection_ms + rc_.planning_ms);
    retrain(true);
  }
  // Otherwise nothing changes for the groups training: new nodes wait in the pool or start a group.
}

void replica_group_policy::on_timer() {
  const double now = clock_.now();
  bool joined = false;
  for (auto& g : groups_) {
    if (g.state != group_state::starting || g.ready_ms > now) continue;
    if (training() < grid_.pipelines) {
      g.state = group_state::training;
      joined = true;
    } else {
      g.state = group_state::warm;
    }
  }
  if (!joined) return;
  clock_.finish_step();  // the quorum admits it at a step boundary
  clock_.pause(activity::reconfiguration, rc_.planning_ms);
  retrain(false);
}

}  // namespace oobleck::sim
