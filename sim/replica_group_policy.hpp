#pragma once
// Replica-group fault tolerance as TorchFT does it (pytorch/torchft: per-step quorum over
// replica groups, a failed group leaves the quorum and its peers step on without it, a
// replacement heals by fetching the current state from a live peer). A replica group is one
// pipeline of the fastest homogeneous grid on the job's N nodes (D groups of depth p; the
// planner's templates): the unit that fails together.
//
//   failure     a lost node takes its whole group out: the step in progress is lost for every
//               group (the quorum's all-reduce fails and the step is retried), then detection_ms
//               and planning_ms (the quorum re-formed over the survivors' communicators) pause
//               all groups. The survivors step on with their own share of the batch: the global
//               batch shrinks to (groups training) / D of B, at the same step time.
//   replacement the group's healthy nodes return to the pool; whenever the pool holds p nodes
//               (spares, repaired nodes, survivors of failed groups) a new group starts: process
//               start restart_fixed_ms, then a copy of one replica's state per node from a live
//               peer (state / p / copy_bytes_per_s), while the others train. It joins at a step
//               boundary, pausing all groups for planning_ms (quorum), and the batch grows back.
//   spare groups with spare_groups = K, up to K started groups wait warm beyond the D that
//               train; a warm group replaces a failed one after only the state copy.
// Never more than D groups train, so the failure-free rate is the grid's.

#include <vector>

#include "sim/policy.hpp"
#include "sim/varuna_policy.hpp"

namespace oobleck::sim {

class replica_group_policy : public policy {
 public:
  replica_group_policy(const sim_job& job, const recovery_costs& costs, double start_ms);

  const char* name() const override { return "torchft"; }
  void on_change(const std::vector<int>& ready, const std::vector<int>& removed) override;
  double next_timer_ms() const override;
  void on_timer() override;

  enum class group_state { training, starting, warm };
  struct group {
    std::vector<int> nodes;
    group_state state = group_state::starting;
    double ready_ms = 0;  ///< starting: when its start-up and state copy are done
  };
  const std::vector<group>& groups() const { return groups_; }
  const grid& configuration() const { return grid_; }
  int training() const;
  double heal_ms() const { return heal_ms_; }

 private:
  void form_groups();
  void retrain(bool failure);  // the clock after the training set changed

  sim_job job_;
  recovery_costs rc_;
  std::shared_ptr<const job_templates> planned_;
  grid grid_;
  double heal_ms_ = 0;  // the state copy of a joining group
  std::vector<int> pool_;  // healthy nodes in no group
  std::vector<group> groups_;
  bool started_once_ = false;
};

}  // namespace oobleck::sim
