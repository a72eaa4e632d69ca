#pragma once
// Oobleck: the real planner's templates, instantiation and reconfiguration policy with its copy
// plan. A loss costs detection + planning + the copy plan's busiest link + the step in progress;
// a join enters at a step boundary and costs planning + copies.
//
// Below (f + 1) n0 nodes, or when a layer lost every holder, the policy says "checkpoint and
// stop", and the job does what the coordinator does since issue 25 item 6: it writes a checkpoint
// of the last committed step (when it has a checkpoint folder and every layer a holder), keeps the
// survivors with their layers, and waits (no progress) until (f + 1) n0 nodes are there again; then
// it resumes by itself:
//   - from memory, where every layer of the last formed configuration still has a surviving
//     holder: the reconfiguration policy over that configuration with every loss and join since,
//     priced like a reconfiguration (planning + the copy plan's busiest link);
//   - else from the checkpoint (the one written at the stop, or the last durable progress before
//     it: what came after is lost): a fresh instantiation whose workers load the state, priced
//     planning + state / load bandwidth (the processes stay up: no restart_fixed_ms). Where no
//     checkpoint exists the coordinator stops the job (exit 4) for an operator; the simulator
//     restarts it from its last durable point (the start at worst) instead.
// The constants: detection, planning and the copy bandwidth are measured on the local cluster by
// bench/recovery (bench/results/recovery.json, what bench/sim_validation predicts with); the
// checkpoint write and the load bandwidth are documented defaults (sim/recovery_costs.hpp), which
// no benchmark measures. The wait itself is not a constant: it lasts until the trace's nodes are
// ready again (their readiness delay: measured by bench/sim_validation's --join-at run).
//
//   running --(policy: checkpoint and stop)--> [checkpoint] --> waiting --(enough nodes)--> running

#include <memory>
#include <set>
#include <vector>

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
  /// ms a resume from a checkpoint takes: planning + the training state / load bandwidth.
  double checkpoint_resume_ms() const;

 private:
  void start();
  /// The policy said checkpoint and stop after losing `lost` (and admitting `joined`).
  void stop(const std::vector<planning::node_id>& lost, const std::vector<planning::node_id>& joined,
            const std::string& reason);
  /// While waiting: resumes once (f + 1) n0 nodes are there.
  void try_resume();
  /// Whether every layer of the waiting configuration has a holder outside lost_since_formed_.
  bool every_layer_held() const;
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
  // While waiting below the minimum: the configuration that formed last, the nodes it lost and
  // those that joined since, whether the survivors' memory still covers every layer, and whether
  // a checkpoint was written at the stop.
  bool waiting_ = false;
  planning::cluster_state formed_;
  std::vector<planning::node_id> lost_since_formed_, joined_since_formed_;
  bool memory_ = false;
  bool checkpointed_ = false;
};

}  // namespace oobleck::sim
