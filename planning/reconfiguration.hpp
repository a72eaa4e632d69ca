#pragma once
// The reconfiguration policy (paper §5, ARCHITECTURE.md §4) as a pure function: lost and joined nodes in;
// new pipelines, the copy plan and the new batch distribution out.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/planner.hpp"

namespace oobleck::planning {

/// Copy one layer's parameters and optimizer state from a surviving holder to a new holder, by
/// node id (epoch_copy, in epoch.hpp, is the same copy in one epoch's ranks).
struct layer_copy {
  layer_index layer;
  node_id from_node;
  node_id to_node;
  std::int64_t bytes = 0;
  bool operator==(const layer_copy&) const = default;
};

enum class reconfiguration_action { continue_training, checkpoint_and_stop };

/// Which rule produced the new configuration (for reports and tests).
enum class reconfiguration_rule { unchanged, simple, borrow, merge, join, replan };

struct reconfiguration {
  reconfiguration_action action = reconfiguration_action::continue_training;
  std::string reason;  ///< why training stops, or which rules applied
  std::vector<reconfiguration_rule> rules;
  std::vector<pipeline_instance> pipelines;
  std::vector<node_id> idle_nodes;
  std::vector<layer_copy> copies;
  double step_ms = 0;  ///< predicted, as job_plan::step_ms
};

/// What the policy needs to know about the job.
struct reconfiguration_context {
  const template_set& templates;
  const layer_costs& costs;
  int fault_tolerance = 0;
  int num_microbatches = 0;
  int microbatch_size = 1;
};

/// The current configuration: pipelines (nodes in stage order) and idle nodes.
struct cluster_state {
  std::vector<pipeline_instance> pipelines;
  std::vector<node_id> idle_nodes;
};

/// Applies one event. Rules, in order: (1) a pipeline that keeps >= n0 nodes is re-instantiated
/// from the template of its remaining size; (2) one below n0 borrows nodes from pipelines that can
/// spare them; (3) otherwise its nodes are merged with others into new pipelines; (4) joined and
/// idle nodes form new pipelines (while there are fewer than B/b) or enlarge existing ones; if the
/// result does not have f + 1 to B/b pipelines using as many nodes as such pipelines can, the whole
/// cluster is re-instantiated keeping each pipeline's surviving nodes together. Nodes no pipeline
/// can use stay idle (`idle_nodes`). (5) Fewer than (f + 1) n0 nodes, or a layer whose every holder
/// was lost, means checkpoint and stop. Surviving nodes keep their pipeline where possible so little
/// state moves; copies spread bytes over the surviving holders of each layer.
///
/// Total: never throws. A lost id not in the configuration and a joined id already in it are
/// ignored; an inconsistent configuration (a pipeline without its template, a node in two places)
/// or a context no job has (no templates, B/b < f + 1) is answered with checkpoint and stop and the
/// reason.
reconfiguration reconfigure(const reconfiguration_context& ctx, const cluster_state& current,
                            std::span<const node_id> lost, std::span<const node_id> joined);

/// Bytes moved to give a node one layer: parameters and optimizer state, not gradients.
std::int64_t layer_copy_bytes(const layer_costs& costs, layer_index layer);

const char* to_string(reconfiguration_action a);
const char* to_string(reconfiguration_rule r);

}  // namespace oobleck::planning
