#include "sim/bamboo_policy.hpp"

#include <algorithm>
#include <numeric>

#include "planning/batch_distribution.hpp"
#include "planning/makespan.hpp"
#include "planning/planner.hpp"

namespace oobleck::sim {

bamboo_policy::bamboo_policy(const sim_job& job, const recovery_costs& costs, double start_ms)
    : policy(start_ms), job_(job), rc_(costs) {
  planning::validate(job_.bamboo_profile);
  num_microbatches_ = planning::microbatches_per_step(job.global_batch, job.bamboo_microbatch);
  // Twice the activations (the successor's redundant forward) and twice the state (its replica).
  planning::profile doubled = job_.bamboo_profile;
  for (auto& l : doubled.layers) l.activation_bytes *= 2;
  planning::job_config config{.nodes = job.nodes, .global_batch = job.global_batch,
                              .microbatch = job.bamboo_microbatch, .state_factor = 2 * job.state_factor};
  const planning::layer_costs& model = costs_.emplace(doubled, planning::job_memory(doubled, config));
  // Bamboo partitions layers uniformly (DeepSpeed's pipeline module), not by memory: the stages
  // near the front, with the most microbatches in flight, run out of memory first.
  const int layers = doubled.num_layers(), width = doubled.gpus_per_node;
  const int most = std::min(layers, job.nodes);
  node_times_.resize(most + 1);
  stage_layers_.resize(most + 1);
  for (int p = 2; p <= most; ++p) {
    std::vector<std::pair<double, double>> times;
    planning::layer_index u{0};
    for (int k = 0; k < p; ++k) {
      const planning::layer_index v{u.value + layers / p + (k >= p - layers % p ? 1 : 0)};
      if (!model.stage_fits(u, v, width, p - k)) {
        times.clear();
        stage_layers_[p].clear();
        break;
      }
      times.push_back({model.forward_ms(u, v, width), model.backward_ms(u, v, width)});
      stage_layers_[p].push_back({u, v});
      u = v;
    }
    node_times_[p] = std::move(times);
  }
  state_bytes_ = state_bytes(job_.bamboo_profile, job.state_factor);
  if (fastest_grid(job.nodes).depth == 0)
    never_runs_ = "out of memory: Bamboo's doubled state and activations of " + job_.bamboo_profile.model +
                  " at microbatch " + std::to_string(job.bamboo_microbatch) + " fit no layout of 2 to " +
                  std::to_string(most) + " nodes";
}

grid bamboo_policy::fastest_grid(int n) const {
  grid best;
  for (int p = 2; p < static_cast<int>(node_times_.size()) && p <= n; ++p) {
    if (node_times_[p].empty()) continue;
    const int d = std::min(n / p, num_microbatches_);
    if (d < 1) continue;
    std::vector<pipeline> fresh(d);
    for (auto& f : fresh)
      for (int s = 0; s < p; ++s) f.push_back({-1, {s}});
    const double step = step_ms(p, fresh, true);
    if (best.depth == 0 || step < best.step_ms) best = {p, d, step};
  }
  return best;
}

double bamboo_policy::step_ms(int depth, const std::vector<pipeline>& ps, bool redundant) const {
  if (ps.empty()) return 0;
  const auto& times = node_times_[depth];
  const int d = static_cast<int>(ps.size());
  double step = 0;
  for (int i = 0; i < d; ++i) {
    const auto& p = ps[i];
    std::vector<double> fwd, bwd;
    for (const auto& m : p) {
      double f = 0, b = 0;
      for (int s : m.stages) {
        f += times[s].first;
        b += times[s].second;
      }
      // A node that runs one stage also runs its successor's forward; one that took a stage over
      // has no replica left to recompute.
      if (redundant && m.stages.size() == 1) f += rc_.bamboo_redundancy_factor * times[(m.stages[0] + 1) % depth].first;
      fwd.push_back(f);
      bwd.push_back(b);
    }
    const int microbatches = num_microbatches_ / d + (i < num_microbatches_ % d ? 1 : 0);
    step = std::max(step, planning::pipeline_time::one_f_one_b(fwd, bwd).at(microbatches));
  }
  // Then, as Oobleck's predicted steps (planning::synchronisation_ms): every node all-reduces the
  // gradients of the stages it runs over their d holders and applies AdamW; the slowest node
  // counts. The successor's replica each node keeps is not charged.
  double sync = 0;
  for (const auto& p : ps)
    for (const auto& m : p) {
      double t = 0;
      for (int s : m.stages) {
        const auto [u, v] = stage_layers_[depth][s];
        t += costs_->synchronisation_ms(u, v, d);
      }
      sync = std::max(sync, t);
    }
  return step + sync;
}

void bamboo_policy::launch(bool restart) {
  const grid g = fastest_grid(static_cast<int>(alive_.size()));
  pipelines_.clear();
  if (g.depth == 0) {
    clock_.stop();
    running_ = false;
    record("wait", 0, 0, "no Bamboo grid fits on " + std::to_string(alive_.size()) + " nodes");
    return;
  }
  depth_ = g.depth;
  auto it = alive_.begin();
  for (int i = 0; i < g.pipelines; ++i) {
    pipeline p;
    for (int s = 0; s < g.depth; ++s) p.push_back({*it++, {s}});
    pipelines_.push_back(std::move(p));
  }
  if (restart) clock_.pause(activity::restart, restart_ms(rc_, state_bytes_));
  const double with = step_ms(depth_, pipelines_, true);
  clock_.run({.step_ms = with, .samples_per_step = static_cast<double>(job_.global_batch),
              .redundant_ms = with - step_ms(depth_, pipelines_, false), .nodes = g.nodes()});
  record(restart ? "restart" : "start", g.nodes(), with,
         std::to_string(g.pipelines) + " x " + std::to_string(g.depth));
  running_ = true;
  started_once_ = true;
}

bool bamboo_policy::take_over(int node) {
  for (auto& p : pipelines_) {
    const auto at = std::find_if(p.begin(), p.end(), [&](const member& m) { return m.node == node; });
    if (at == p.end()) continue;
    if (p.size() == 1 || at->stages.size() > 1) return false;
    const auto i = static_cast<std::size_t>(at - p.begin());
    auto& pred = p[(i + p.size() - 1) % p.size()];
    if (pred.stages.size() > 1) return false;  // its replica of this stage is already in use
    pred.stages.push_back(at->stages.front());
    p.erase(at);
    return true;
  }
  return true;  // not in a pipeline: a waiting node
}

void bamboo_policy::on_change(const std::vector<int>& ready, const std::vector<int>& removed) {
  for (int n : removed) alive_.erase(n);
  alive_.insert(ready.begin(), ready.end());
  if (!running_) {
    launch(started_once_);
    return;
  }
  std::set<int> used;
  for (const auto& p : pipelines_)
    for (const auto& m : p) used.insert(m.node);
  std::vector<int> lost;
  for (int n : removed)
    if (used.count(n)) lost.push_back(n);
  if (lost.empty()) return;  // joined nodes wait for the next restart
  clock_.interrupt();
  clock_.pause(activity::reconfiguration, rc_.detection_ms);
  bool fatal = false;
  for (int n : lost) fatal = fatal || !take_over(n);
  if (fatal) {
    launch(true);
    return;
  }
  clock_.pause(activity::reconfiguration, rc_.bamboo_takeover_ms);
  const double with = step_ms(depth_, pipelines_, true);
  int nodes = 0;
  for (const auto& p : pipelines_) nodes += static_cast<int>(p.size());
  clock_.run({.step_ms = with, .samples_per_step = static_cast<double>(job_.global_batch),
              .redundant_ms = with - step_ms(depth_, pipelines_, false), .nodes = nodes});
  record("takeover", nodes, with, std::to_string(lost.size()) + " stage(s) taken over by predecessors");
}

}  // namespace oobleck::sim
