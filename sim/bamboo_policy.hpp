#pragma once
// Bamboo-like redundant computation (Thorpe et al., NSDI'23). Pipelines of depth p >= 2 with
// layers split uniformly (DeepSpeed's partitioning, which Bamboo builds on; times and memory from
// the planner's cost model on Bamboo's own profile: its microbatch, no activation checkpointing), each
// node holding its stage and a replica of its successor's (the last node holds the first's):
// twice the state and, for the redundant forward, twice the activations (Oobleck paper §6.3: "an
// additional copy of model states for redundant computation and activations"). A layout that does
// not fit is out of memory; when none fits the job never runs (throughput 0, as the paper reports).
//
// Every step each node also runs its successor's forward (times the redundancy factor): the step
// time is the 1F1B makespan of the stages with those longer forwards, and the difference to the
// makespan without them is `redundant` time; then, as in Oobleck's predicted steps, each node's
// gradient all-reduce over the pipelines and AdamW for the stages it runs (the successor's
// replica is not charged). Microbatches are split evenly across pipelines
// (homogeneous). When a node is lost its predecessor takes its stage over (a pause of the takeover
// cost; the step in progress is lost) and runs both stages from then on, so that pipeline
// straggles. A loss is fatal, and the job restarts from a checkpoint on a new grid of all ready
// nodes (restart cost; checkpoints are assumed free and current, so no progress is lost beyond the
// step), when the lost node had already taken over a stage, its predecessor has, or it was alone.
// Nodes that join wait for the next restart (as in the Bamboo artifact's simulator).

#include <optional>
#include <set>
#include <vector>

#include "planning/cost_model.hpp"
#include "sim/policy.hpp"
#include "sim/varuna_policy.hpp"

namespace oobleck::sim {

class bamboo_policy : public policy {
 public:
  bamboo_policy(const sim_job& job, const recovery_costs& costs, double start_ms);

  const char* name() const override { return "bamboo"; }
  void on_change(const std::vector<int>& ready, const std::vector<int>& removed) override;

  /// A node of a running pipeline and the stages (layout node indices) it runs.
  struct member {
    int node = 0;
    std::vector<int> stages;
  };
  using pipeline = std::vector<member>;

  const std::vector<pipeline>& pipelines() const { return pipelines_; }
  /// Step time of pipelines of this depth (ms), with or without the redundant forwards.
  double step_ms(int depth, const std::vector<pipeline>& ps, bool redundant) const;
  /// Fastest grid of fresh pipelines on at most n nodes (depth 0: none fits).
  grid fastest_grid(int n) const;

 private:
  void launch(bool restart);
  bool take_over(int node);  // false: fatal

  sim_job job_;
  recovery_costs rc_;
  int num_microbatches_ = 0;
  int depth_ = 0;
  double state_bytes_ = 0;
  std::vector<std::vector<std::pair<double, double>>> node_times_;  // [depth][stage] = (fwd, bwd); empty: OOM
  std::vector<std::vector<std::pair<planning::layer_index, planning::layer_index>>> stage_layers_;     // [depth][stage] = its layers [u, v)
  std::optional<planning::layer_costs> costs_;                      // Bamboo's profile: all-reduce and AdamW
  std::set<int> alive_;
  std::vector<pipeline> pipelines_;
  bool running_ = false;
  bool started_once_ = false;
};

}  // namespace oobleck::sim
