#pragma once
// Oobleck: the real planner's templates, instantiation and reconfiguration policy with its copy
// plan. A loss costs detection + planning + the copy plan's busiest link + the step in progress;
// a join enters at a step boundary and costs planning + copies. Below (f + 1) n0 nodes the job
// writes a checkpoint and stops; it restarts (fixed + load) when enough nodes are ready again.

#include <memory>
#include <set>

#include "planning/cost_model.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "sim/policy.hpp"

namespace oobleck::sim {

class oobleck_policy : public policy {
 public:
  /// Plans the job's templates for job.nodes nodes; planning::planning_error when the job is
  /// impossible (N < (f + 1) n0, a bad batch).
  oobleck_policy(const sim_job& job, const recovery_costs& costs, double start_ms);

  const char* name() const override { return "oobleck"; }
  void on_change(const std::vector<int>& ready, const std::vector<int>& removed) override;

  int n0() const { return n0_; }
  /// The configuration now (empty while stopped).
  const planning::cluster_state& state() const { return state_; }
  /// ms the copy plan takes: the busiest link's bytes (in or out) / copy bandwidth.
  double copy_ms(const std::vector<planning::layer_copy>& copies) const;

 private:
  void start();
  int nodes_in_use() const;
  /// step_ms x the job's step_scale for `nodes` training nodes.
  double scaled(double step_ms, int nodes) const;

  sim_job job_;
  recovery_costs rc_;
  std::shared_ptr<const job_templates> planned_;
  const planning::layer_costs* costs_ = nullptr;
  const planning::template_set* templates_ = nullptr;
  int n0_ = 0;
  int num_microbatches_ = 0;
  double state_bytes_ = 0;
  planning::cluster_state state_;
  std::set<int> alive_;
  bool running_ = false;
  bool started_once_ = false;
};

}  // namespace oobleck::sim
