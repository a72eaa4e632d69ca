#pragma once
// What a simulated job is and how a fault-tolerance policy reacts to a changing cluster. Each
// policy owns a timeline and tells it what the job does after every change.

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/planner.hpp"
#include "planning/profile.hpp"
#include "sim/recovery_costs.hpp"
#include "sim/timeline.hpp"

namespace oobleck::sim {

/// The planner's templates for a job, computed once and shared by the policies that lay out
/// pipelines with them (Oobleck, checkpoint-restart, replica groups): at 126 layers the templates
/// are the expensive part of a simulation.
struct job_templates {
  std::unique_ptr<planning::layer_costs> costs;
  planning::template_set templates;
  int n0 = 0;
  int n_max = 0;
};

/// The job every policy trains.
struct sim_job {
  planning::profile profile;         ///< Oobleck and Varuna (activation checkpointing)
  planning::profile bamboo_profile;  ///< Bamboo: its own microbatch, no activation checkpointing
  int nodes = 0;                     ///< N: the most nodes the job uses; Oobleck's templates are planned for it
  int fault_tolerance = 0;           ///< f
  int global_batch = 0;              ///< B, the same for every policy
  int microbatch = 0;                ///< b (Oobleck, Varuna)
  int bamboo_microbatch = 0;         ///< Bamboo's b
  double state_factor = 4.0;         ///< bytes of training state per parameter byte
  /// Oobleck's step time x step_scale[n] while n nodes train (missing or empty: x 1). A measured
  /// contention model for a cluster whose nodes share cores (bench/sim_validation): on one
  /// machine, n worker processes do not run n times the work of one.
  std::vector<double> step_scale;
  /// Templates larger than this many nodes are not generated (0: all up to n_max, as the real
  /// planner does). Only to keep simulations of huge jobs affordable while the planner is slow at
  /// that size; reports say when it is set.
  int max_template_nodes = 0;
  /// Oobleck below (f + 1) n0 nodes, or when a layer lost every holder: whether the job has a
  /// checkpoint folder. The coordinator (issue 25, item 6) then writes a checkpoint of the last
  /// committed step before it waits for nodes; without one (oobleck-local --trace with no
  /// --checkpoint-dir, as bench/sim_validation replays) it waits with the survivors' memory only.
  bool checkpoint_folder = true;
  /// Shared templates (plan_templates); empty: each policy plans its own.
  std::shared_ptr<const job_templates> templates;
};

/// Plans the job's templates n0 .. min(n_max, max_template_nodes) with the planner's node
/// specification; planning::planning_error when the job is impossible.
std::shared_ptr<const job_templates> plan_templates(const sim_job& job);

/// One decision of a policy, for reports and tests.
struct decision {
  double ms = 0;
  std::string what;    ///< "start", "reconfigure", "takeover", "restart", "morph", "stop", "wait", "resume"
  int nodes_in_use = 0;
  double step_ms = 0;  ///< of the new configuration (0 when not training)
  std::string detail;
  double samples_per_step = 0;  ///< of the new configuration (0 when not training)
};

class policy {
 public:
  explicit policy(double start_ms) : clock_(start_ms) {}
  virtual ~policy() = default;
  policy(const policy&) = delete;
  policy& operator=(const policy&) = delete;

  virtual const char* name() const = 0;
  /// At clock().now(), nodes became ready to the job and/or were removed from it (each removed
  /// id was ready before; no id is in both lists).
  virtual void on_change(const std::vector<int>& ready, const std::vector<int>& removed) = 0;
  /// When the policy next acts on its own (a replica group finishing its start-up); infinity when
  /// nothing is pending. The simulator advances the clock there and calls on_timer().
  virtual double next_timer_ms() const { return std::numeric_limits<double>::infinity(); }
  virtual void on_timer() {}

  timeline& clock() { return clock_; }
  const timeline& clock() const { return clock_; }
  const std::vector<decision>& decisions() const { return decisions_; }
  /// Why the policy never trains at all (e.g. "out of memory: ..."); empty otherwise.
  const std::string& never_runs() const { return never_runs_; }

 protected:
  void record(std::string what, int nodes, double step_ms, std::string detail = {}) {
    decisions_.push_back({clock_.now(), std::move(what), nodes, step_ms, std::move(detail),
                          clock_.rate() ? clock_.rate()->samples_per_step : 0.0});
  }
  timeline clock_;
  std::vector<decision> decisions_;
  std::string never_runs_;
};

/// Bytes of training state: every parameter byte times the state factor.
double state_bytes(const planning::profile& p, double state_factor);

/// Restart after a checkpoint: fixed + state / load bandwidth (ms).
double restart_ms(const recovery_costs& c, double state_bytes);

/// Writing a checkpoint: fixed + state / storage bandwidth (ms).
double checkpoint_ms(const recovery_costs& c, double state_bytes);

}  // namespace oobleck::sim
