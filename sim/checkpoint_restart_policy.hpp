#pragma once
// Checkpoint-restart as today's large runs do it (Llama 3, MegaScale): one fixed configuration,
// the fastest homogeneous grid of D pipelines x depth p on the job's N nodes (layouts: the
// planner's templates), periodic asynchronous checkpoints, and on every loss of a node it uses a
// restart of the whole job from the last completed checkpoint on N healthy nodes (a spare
// replaces the lost one; without enough healthy nodes the job waits for a repair).
//
// Costs (recovery_costs; frontier values and their sources in frontier_recovery_costs()):
//   checkpoint  every interval (checkpoint_interval_s, or Young-Daly's sqrt(2 C MTTF), at least
//               one write) training blocks for the snapshot C = state / (D p M GPUs) /
//               snapshot_bytes_per_s (every GPU copies its share of one replica's state to host
//               memory); the write, state / storage_bytes_per_s, runs in the background and the
//               checkpoint counts only once it has completed.
//   failure     the step in progress and everything since the last completed checkpoint are lost
//               (fallback), then detection_ms, then restart_fixed_ms + state / load_bytes_per_s.
//   nodes join  nothing: the configuration is fixed; they wait as spares.

#include <memory>
#include <set>
#include <string>

#include "sim/policy.hpp"
#include "sim/varuna_policy.hpp"

namespace oobleck::sim {

class checkpoint_restart_policy : public policy {
 public:
  /// mttf_ms: the job's mean time to failure, for Young-Daly's interval (0: unknown, 30 min
  /// unless costs.checkpoint_interval_s says otherwise).
  checkpoint_restart_policy(const sim_job& job, const recovery_costs& costs, double start_ms, double mttf_ms);

  const char* name() const override { return "ckpt-restart"; }
  void on_change(const std::vector<int>& ready, const std::vector<int>& removed) override;

  const grid& configuration() const { return grid_; }
  double snapshot_ms() const { return snapshot_ms_; }
  double write_ms() const { return write_ms_; }
  double interval_ms() const { return interval_ms_; }
  double restart_ms() const { return restart_ms_; }

 private:
  void launch(bool restart);

  sim_job job_;
  recovery_costs rc_;
  std::shared_ptr<const job_templates> planned_;
  grid grid_;
  double snapshot_ms_ = 0, write_ms_ = 0, interval_ms_ = 0, restart_ms_ = 0;
  std::set<int> alive_;
  std::set<int> in_use_;
  bool running_ = false;
  bool started_once_ = false;
};

/// The fastest grid on `nodes` nodes from a template set (depths: the templates' sizes).
grid fastest_template_grid(const job_templates& t, int nodes, int num_microbatches);

/// What a policy of one fixed shape (checkpoint-restart, replica groups) runs: the job's templates
/// (shared, else planned now) and their fastest grid on all the job's nodes; `never_runs` says why
/// when no grid fits (then `shape.depth` is 0).
struct fixed_grid {
  std::shared_ptr<const job_templates> planned;
  grid shape;
  std::string never_runs;
};
fixed_grid plan_fixed_grid(const sim_job& job);

}  // namespace oobleck::sim
