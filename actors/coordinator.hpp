#pragma once
// The coordinator actor (DESIGN §5): the job's node registry and the operators' entry point. It
// admits workers (admission.hpp), monitors each admitted node's monitor actor, so that a node's
// loss (its process crashed, or the connection timed out) arrives here as a down message, and
// publishes what happens to subscriber actors (the extension point for users' own actors).
//
//   registering --(every expected node admitted)--> ready --(steps > 0)--> forming
//        ^                                            |                      | every node_ready
//        +------------(a node is lost)----------------+                      v
//                                                                  training: run_step{e,k} to
//   finished <--(k == steps)-- committing <--(every pipeline_done)-- every pipeline actor;
//                                  | every step_committed: digests checked, next step
//   A node lost while forming or training stops the job (failed): recovery is the fault-tolerance
//   work, not built yet.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <caf/stateful_actor.hpp>

#include "actors/admission.hpp"
#include "actors/step_breakdown.hpp"
#include "messages/actor_interfaces.hpp"
#include "planning/epoch.hpp"
#include "planning/planner.hpp"
#include "planning/profile.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::actors {

/// One committed step, for metrics (--metrics-out writes one JSON line each).
struct step_record {
  std::uint64_t step = 0;
  std::uint64_t epoch = 0;
  double loss = 0;  ///< mean over the global batch
  std::int64_t samples = 0;
  std::vector<std::pair<std::vector<std::int64_t>, std::int32_t>> pipelines;  ///< nodes, microbatches
  std::map<std::int32_t, std::vector<std::uint64_t>> layer_digests;  ///< per layer: every holder's
  double wall_ms = 0;
  step_breakdown breakdown;  ///< where wall_ms went (step_breakdown.hpp)
};

/// One reconfiguration, for metrics: written once the first step after it has committed.
struct reconfiguration_record {
  std::uint64_t epoch = 0;            ///< the epoch that took over
  std::vector<std::int64_t> lost;     ///< nodes lost since the last formed epoch
  std::vector<std::int64_t> joined;
  std::string action;                 ///< the policy's rules, e.g. "simple", "borrow+merge", "unchanged"
  double detect_ms = 0;   ///< from the start of the interrupted step to the loss notice (an upper bound)
  double plan_ms = 0;     ///< the policy's decision and the epoch mapping
  std::int64_t copy_bytes = 0;
  double copy_ms = 0;     ///< from the assignments to every node ready: mesh, copies, stage views
  std::uint64_t resumed_step = 0;
  double downtime_ms = 0;  ///< from the last commit before the failure to the first one after
};

/// What the coordinator is built with (the composition root fills it).
struct coordinator_deps {
  admission_policy policy;
  std::string job_toml;          ///< sent to every admitted worker
  std::int32_t expected_nodes = 1;  ///< nodes to wait for before the job is ready
  /// Progress lines for humans (stdout in oobleck-coordinator).
  std::function<void(const std::string&)> log = [](const std::string&) {};
  std::function<nonce_book::clock::time_point()> now = [] { return nonce_book::clock::now(); };
  /// Training: the profile the planner uses, the job (its node count is set when an epoch forms),
  /// and the steps to run (0: admission only, no training).
  planning::profile profile;
  planning::job_config job;
  std::uint64_t steps = 0;
  std::function<void(const step_record&)> on_step = [](const step_record&) {};
  std::function<void(const reconfiguration_record&)> on_reconfigured = [](const reconfiguration_record&) {};
};

/// One admitted node.
struct node_entry {
  std::string name;
  std::int32_t slots = 1;
  messages::endpoint data;
  messages::monitor_actor monitor;
  std::string state = "registered";  ///< "registered" or "lost"
  std::string lost_reason;
};

/// A pipeline of the current epoch.
struct running_pipeline {
  std::vector<std::int64_t> nodes;  ///< in stage order
  std::int32_t first_microbatch = 0;
  std::int32_t microbatches = 0;
  messages::pipeline_actor actor;
};

struct coordinator_state {
  coordinator_deps deps;
  // training
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;  ///< the step running or next to run
  std::uint64_t committed = 0;
  std::vector<std::int64_t> in_epoch;  ///< nodes assigned in this epoch (ranked or idle)
  std::map<std::int64_t, std::vector<caf::actor>> ready;  ///< node_ready so far: stage handles
  std::vector<std::vector<std::pair<std::int64_t, std::int32_t>>> stage_nodes;  ///< [pipeline][stage]: node, index in its node_ready
  std::vector<running_pipeline> pipelines;
  std::size_t pipelines_pending = 0;
  double loss_sum = 0;
  std::map<std::int64_t, bool> commits_pending;
  step_record record;
  step_clock timing;  ///< the step in progress: T0, T1 and the slowest reports
  nonce_book::clock::time_point step_started;
  nonce_book::clock::time_point last_commit;  ///< when the last step committed (or training began)
  std::optional<reconfiguration_record> recovering;  ///< until the first commit after it
  nonce_book::clock::time_point assignments_sent;
  double last_loss = 0;
  double samples_per_second = 0;
  std::uint64_t dropped = 0;  ///< messages of another epoch or step
  // reconfiguration
  planning::template_set templates;        ///< of the job, from the first plan
  planning::cluster_state formed;          ///< the last epoch that formed everywhere: where layers are
  bool formed_once = false;                ///< some epoch has formed everywhere (layers exist)
  planning::cluster_state forming;         ///< the configuration of the epoch being formed
  std::vector<std::int64_t> lost_since_formed;
  std::vector<std::int64_t> joining;  ///< admitted during training: enter at the next step boundary
  std::uint64_t reconfigurations = 0;
  int failures_without_loss = 0;  ///< failed steps or epochs since the last commit or loss
  static constexpr int max_failures_without_loss = 3;
  nonce_book nonces;
  std::map<std::int64_t, node_entry> nodes;
  std::int64_t next_node = 0;
  std::string job_state = "registering";
  std::vector<caf::actor> subscribers;
  std::uint64_t refused = 0;  ///< registrations refused so far

  static inline const char* name = "oobleck.coordinator";
};

using coordinator_pointer = messages::coordinator_actor::stateful_pointer<coordinator_state>;

messages::coordinator_actor::behavior_type coordinator(coordinator_pointer self, coordinator_deps deps);

/// The status snapshot the coordinator replies with (also used by tests).
messages::job_status make_status(const coordinator_state& st);

}  // namespace oobleck::actors
