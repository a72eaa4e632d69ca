#pragma once
// Varuna-like checkpoint-restart (Athlur et al., EuroSys'22; the Oobleck paper's §6.1 setup):
// the fastest homogeneous grid of D pipelines x depth p for the node count (layouts from the same
// profile and planner cost model), a synchronous checkpoint every k steps, and a restart from the
// last checkpoint on every loss of a node it uses: progress since that checkpoint is lost, the
// restart costs fixed + load time. Nodes that join are used when a larger grid is faster: the job
// checkpoints at a step boundary and restarts on the new grid ("job morphing"); otherwise they
// wait. Removing a node the grid does not use costs nothing.

#include <optional>
#include <set>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/pipeline_template.hpp"
#include "sim/policy.hpp"

namespace oobleck::sim {

/// A homogeneous grid: `pipelines` copies of the `depth`-node layout.
struct grid {
  int depth = 0;  ///< 0: nothing fits
  int pipelines = 0;
  double step_ms = 0;
  int nodes() const { return depth * pipelines; }
};

/// Fastest grid on at most n nodes: for every depth p with a layout, D = min(n / p, B / b)
/// pipelines, the microbatches split evenly (the slowest pipeline takes ceil(B / b / D)).
/// layouts[p] is the layout of depth p (nullopt: none fits). Ties go to the smaller grid. A
/// grid's step is its pipelines' makespan plus, as Oobleck's predicted steps
/// (planning::synchronisation_ms), each node's gradient all-reduce over the D pipelines and AdamW
/// (0 for a profile without link and optimizer costs).
grid fastest_grid(const std::vector<std::optional<planning::pipeline_template>>& layouts, int n, int num_microbatches,
                  const planning::layer_costs& costs);

class varuna_policy : public policy {
 public:
  varuna_policy(const sim_job& job, const recovery_costs& costs, double start_ms);

  const char* name() const override { return "varuna"; }
  void on_change(const std::vector<int>& ready, const std::vector<int>& removed) override;

  grid best_grid(int n) const { return fastest_grid(layouts_, n, num_microbatches_, *costs_); }
  const grid& current() const { return grid_; }

 private:
  void launch(bool restart);

  sim_job job_;
  recovery_costs rc_;
  int num_microbatches_ = 0;
  double state_bytes_ = 0;
  std::vector<std::optional<planning::pipeline_template>> layouts_;  // [depth]
  std::optional<planning::layer_costs> costs_;
  std::set<int> alive_;
  std::set<int> in_grid_;
  grid grid_;
  bool running_ = false;
  bool started_once_ = false;
};

}  // namespace oobleck::sim
