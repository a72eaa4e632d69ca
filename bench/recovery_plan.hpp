#pragma once
// The planner's view of the recovery benchmark's jobs: the coordinator's plan of a job and its
// copy plans, recomputed here (same synthetic profile, same policy) to find each copy plan's
// busiest link.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::bench {

struct job_model {
  apps::job_file job;
  planning::profile profile;
  planning::job_config config;

  job_model(const std::string& text, int nodes);
};

/// Replays the coordinator's decisions: the initial plan on nodes 0..N-1, then one reconfiguration
/// per loss (relative to the last formed configuration, as the coordinator does).
class plan_replay {
 public:
  explicit plan_replay(const job_model& m);
  planning::reconfiguration lose(const std::vector<planning::node_id>& lost);
  [[nodiscard]] const planning::cluster_state& formed() const { return formed_; }
  [[nodiscard]] double predicted_step_ms() const { return plan_.step_ms; }

 private:
  const job_model& m_;
  planning::job_plan plan_;
  std::optional<planning::layer_costs> costs_;
  planning::cluster_state formed_;
};

/// The busiest link of a copy plan: the most bytes one node sends or receives.
std::int64_t busiest_link_bytes(const std::vector<planning::layer_copy>& copies);

/// "250/1500": the job's default heartbeat interval and connection timeout, in ms.
std::string default_heartbeat();

}  // namespace oobleck::bench
