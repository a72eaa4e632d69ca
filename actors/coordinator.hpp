#pragma once
// The coordinator actor (ARCHITECTURE.md §10): the job's node registry, its plan and step counters,
// the commit decisions, and the operators' entry point. It admits workers (admission.hpp),
// monitors each admitted node's monitor actor, so that a node's loss (its process crashed, or the
// connection timed out) arrives here as a down message, and publishes what happens as typed
// job_events to subscriber actors (the extension point for users' own actors) and to
// deps.on_event. Its phases, each a type holding only its own fields, and the machine they form
// are in coordinator_phase.hpp; the training protocol is in coordinator_training.hpp, checkpoints
// in coordinator_checkpoint.hpp.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/admission.hpp"
#include "actors/coordinator_phase.hpp"
#include "actors/step_breakdown.hpp"
#include "messages/actor_interfaces.hpp"
#include "planning/epoch.hpp"
#include "planning/planner.hpp"
#include "planning/profile.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::actors {

/// One reconfiguration, for metrics: written once the first step after it has committed.
struct reconfiguration_record {
  std::uint64_t epoch = 0;            ///< the epoch that took over
  std::vector<node_id> lost;  ///< nodes lost since the last formed epoch
  std::vector<node_id> joined;
  std::string action;                 ///< the policy's rules, e.g. "simple", "borrow+merge", "unchanged"
  double detect_ms = 0;   ///< from the start of the interrupted step to the loss notice (an upper bound)
  double plan_ms = 0;     ///< the policy's decision and the epoch mapping
  std::int64_t copy_bytes = 0;
  /// The copy plan's slowest node, in its own clock: as a receiver, from telling its sources it is
  /// ready (they send nothing before) to its last layer installed; as a source, from a target's ready
  /// to its sends posted (form_timing). Every copied byte travels within its receiver's span, so
  /// copy_bytes / copy_ms is a lower bound of the copies' effective bandwidth.
  double copy_ms = 0;
  /// The receiving nodes' longest wait, within their copy_ms, for the first message of each of their
  /// sources (the senders' skew: a sender still connecting or sending to others first).
  double copy_wait_ms = 0;
  double connect_ms = 0;  ///< the slowest node's data-plane mesh of the new epoch
  double prepare_ms = 0;  ///< the slowest node's allocation of incoming layers (during its connect)
  double views_ms = 0;    ///< the slowest node's stage executor over its store
  double form_ms = 0;     ///< from the assignments to every node ready: all of the above and the messages
  std::uint64_t resumed_step = 0;
  double downtime_ms = 0;  ///< from the last commit before the failure to the first one after
};

/// One evaluation round (ARCHITECTURE.md §5 "Evaluation"): the mean loss over the first `windows`
/// windows of the validation data, with the weights committed by step `step`.
struct eval_record {
  std::uint64_t step = 0;  ///< the last committed step (the record's weights are its)
  std::uint64_t epoch = 0;
  double loss = 0;
  std::int32_t windows = 0;
  double wall_ms = 0;
};

/// A replacement coordinator adopted the job from its nodes (ARCHITECTURE.md §10 "Coordinator
/// loss"): written once the first step after it has committed.
struct restore_record {
  std::uint64_t term = 0;
  std::int32_t nodes = 0;  ///< nodes adopted (with the job's state) and admitted fresh
  std::uint64_t step = 0;  ///< the first step it ran
  std::int32_t completed = 0;  ///< nodes that applied the decided commit from their kept gradients
  double downtime_ms = 0;  ///< from the nodes' last commit before the loss to the first one after
};

/// The job is below its minimum and waits for nodes (ARCHITECTURE.md §10 "Waiting for nodes"):
/// written when the wait begins and whenever the number of nodes changes during it.
struct waiting_record {
  std::int32_t have = 0;  ///< live nodes (survivors and nodes admitted since)
  std::int32_t need = 0;  ///< (f + 1) x the smallest template's nodes
  std::uint64_t step = 0;  ///< the next step (the committed state's)
  std::string reason;      ///< why the policy could not go on
  std::optional<std::string> checkpoint;  ///< the checkpoint it falls back to, if any
};

/// The job goes on after a wait: from the survivors' memory, or from a checkpoint.
struct resumed_record {
  std::string source;      ///< "memory" or "checkpoint"
  std::string checkpoint;  ///< the checkpoint's directory (source "checkpoint")
  std::uint64_t step = 0;  ///< the first step it runs
  std::int32_t nodes = 0;
  double waited_ms = 0;    ///< from the start of the wait
};

/// How the job stopped when the reconfiguration policy said "checkpoint and stop".
struct checkpoint_stop_record {
  std::string reason;
  std::optional<std::string> dir;     ///< the checkpoint written now; nullopt: none could be
  std::optional<std::string> latest;  ///< without one: the newest complete checkpoint, if any
  std::uint64_t step = 0;             ///< the next step (the committed state's)
};

/// Checkpoints (ARCHITECTURE.md §5 "Checkpoint"): the coordinator decides when and who writes what; the
/// composition root gives it the file operations (runtime/checkpoint), so this library stays free
/// of file formats. Every function may throw std::exception with a sentence for the log.
struct checkpoint_deps {
  std::string root;         ///< where checkpoints go (shared by every node); empty: nowhere
  std::uint64_t every = 0;  ///< a checkpoint after each commit that makes the next step a multiple; 0: never
  /// A fresh temporary directory for the checkpoint of `step`, under root.
  std::function<std::string(std::uint64_t step)> begin;
  /// Writes the manifest of the files, validates, renames: returns the checkpoint's directory.
  std::function<std::string(const std::string& temp, std::uint64_t step,
                            const std::vector<messages::checkpoint_layer_file>& files)>
      finish;
  std::function<void(const std::string& temp)> discard = [](const std::string&) {};
  /// The newest complete checkpoint under root ("" when none).
  std::function<std::string()> latest = [] { return std::string(); };
  /// The command that resumes from a directory (printed when the job stops).
  std::function<std::string(const std::string& dir)> resume_command = [](const std::string& dir) {
    return "--resume " + dir;
  };
  /// A resumed job: the validated checkpoint its first epoch installs, and its step.
  std::string resume_dir;
  std::uint64_t resume_step = 0;
  /// Called once when the job stops for lack of nodes (metrics record, exit status).
  std::function<void(const checkpoint_stop_record&)> on_stop = [](const checkpoint_stop_record&) {};
  /// begin, finish and discard touch the disk (hashing, fsync): true runs them in a detached helper
  /// actor, so the coordinator goes on answering; false in a scheduled one (deterministic tests).
  bool off_thread = false;
  /// A writer's deadline: write_floor + 3 x (the parameter bytes of its layers) / write_bytes_per_second
  /// (a layer file holds the parameters and AdamW's two moments).
  std::chrono::milliseconds write_floor{30'000};
  double write_bytes_per_second = 20e6;
};

/// How the coordinator treats nodes that fail or stall without being lost (ARCHITECTURE.md §5
/// "Stage faults"); the job file's [faults] table fills it. Every deadline's expiry is a fault like
/// any other: the epoch is aborted and formed again, and the node found responsible gets a strike;
/// a node with enough strikes since the last commit is evicted (declared lost, told to exit).
struct fault_policy {
  int evict_after_errors = 3;  ///< own stage failures (exceptions) of a node before it is evicted
  int evict_after_stalls = 2;  ///< stalls (named culprit of a missed deadline) before it is evicted
  /// A step's deadline: the larger of this and step_deadline_factor x the median of the last 20
  /// committed steps' wall times; the first step of an epoch gets step_deadline_min_ms on top; a
  /// job with no committed step yet uses first_step_deadline_ms.
  double step_deadline_min_ms = 10'000;
  double step_deadline_factor = 10;
  double first_step_deadline_ms = 60'000;
  /// An epoch's forming deadline: this plus its copy plan's bytes at form_bytes_per_ms (the data
  /// plane's connect timeout on the workers is twice this, so the coordinator's deadline, which
  /// can name the culprit, comes first).
  double form_deadline_ms = 30'000;
  double form_bytes_per_ms = 10'000;  ///< 10 MB/s: a floor, not an estimate
  /// After a deadline, how long the nodes have to answer the stall probe.
  double probe_ms = 1'000;
  /// Replicas' digests are computed and compared on steps that are multiples of this, on the first
  /// commit of every epoch (after every reconfiguration) and on the job's last step ([faults]
  /// digest_every; 1: every step).
  std::uint64_t digest_every = 1;
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
  /// Profile at job start (ARCHITECTURE.md §4): true when the job has no profile file (nor a cached
  /// one). Once the expected nodes are admitted, one of them measures the model and the first plan
  /// waits for it; `profile` is then only the modelled one the job was checked with before anyone
  /// registered. `accept_profile` decodes and checks what the node sent (throws, saying why);
  /// `on_profiled` keeps the accepted profile (the composition root's cache). A node that does not
  /// answer within profile_deadline_ms stops the job.
  bool profile_at_start = false;
  std::function<planning::profile(const std::string&)> accept_profile;
  std::function<void(const planning::profile&)> on_profiled = [](const planning::profile&) {};
  double profile_deadline_ms = 600'000;
  planning::job_config job;
  std::uint64_t steps = 0;
  std::function<void(const step_record&)> on_step = [](const step_record&) {};
  std::function<void(const reconfiguration_record&)> on_reconfigured = [](const reconfiguration_record&) {};
  /// Global-norm gradient clipping ([optimizer] clip_norm; 0: off): the stages report their squared
  /// norms, the commit carries the factor.
  double clip_norm = 0;
  /// Evaluation ([eval]): after every eval_every committed steps (0: never), a round over the first
  /// eval_windows windows of the validation data, split across the pipelines.
  std::uint64_t eval_every = 0;
  std::int32_t eval_windows = 0;
  std::function<void(const eval_record&)> on_eval = [](const eval_record&) {};
  /// Called with a sentence when the coordinator finds a bug of its own (a phase entered along an
  /// edge its machine does not have); it goes on. Tests fail on it.
  std::function<void(const std::string&)> on_bug = [](const std::string&) {};
  /// Every event published to subscribers, as it is published (--events-out writes them).
  std::function<void(const messages::job_event&)> on_event = [](const messages::job_event&) {};
  /// The NCCL data plane ([cluster] data_plane = "nccl", ARCHITECTURE.md §12 "NCCL"): draws a
  /// fresh ncclUniqueId (runtime::new_nccl_unique_id) for every epoch, which the epoch's
  /// assignments carry with the epoch's links (planning::p2p_links). Empty: the host transport.
  /// The coordinator draws it because the process that draws an id hosts the bootstrap of the
  /// communicators made from it, and the coordinator outlives every epoch.
  std::function<std::vector<std::uint8_t>()> new_nccl_id;
  checkpoint_deps checkpoint;
  fault_policy faults;
  /// Coordinator loss (ARCHITECTURE.md §10): this coordinator's term before it adopts anyone (it
  /// goes above every term its nodes report); how long it waits for the nodes of a job it adopts
  /// after the first came back; the record of an adoption.
  std::uint64_t term = 1;
  double adopt_wait_ms = 10'000;
  /// A coordinator that lost every node at once (it was frozen or cut off, not them) waits this
  /// long for them to come back with their state before it stops.
  double grace_ms = 60'000;
  /// After a node's loss, how long the coordinator waits for any other node to answer a ping
  /// before it handles the loss (an answer ends the wait at once); every node lost in the meantime
  /// means this coordinator was cut off or frozen (twice the heartbeat interval is enough).
  double loss_window_ms = 500;
  std::function<void(const restore_record&)> on_restored = [](const restore_record&) {};
  /// Below the minimum (ARCHITECTURE.md §10 "Waiting for nodes"): when the reconfiguration policy
  /// says "checkpoint and stop", write the checkpoint (when there is a folder) and wait for nodes
  /// instead of stopping; resume by itself once (f + 1) x n0 nodes are there. false: stop (exit 4).
  bool wait_below_minimum = false;
  /// The longest such wait (0: unlimited); then the job stops as without waiting.
  double wait_for_nodes_ms = 0;
  std::function<void(const waiting_record&)> on_waiting = [](const waiting_record&) {};
  std::function<void(const resumed_record&)> on_resumed = [](const resumed_record&) {};
  /// Fault injection into the coordinator itself (oobleck-local --kill-coordinator-at,
  /// --hang-coordinator-at): called as each step is sent to the pipelines (a step whose orders
  /// went out with the previous commit: when that commit completed and the step is in force).
  std::function<void(std::uint64_t step)> on_step_sent = [](std::uint64_t) {};
  /// Called when the first pipeline of a step reports it done: the step is under way everywhere
  /// and its commit not decided (--kill-coordinator-at kills the coordinator here, a point in the
  /// middle of the step that no scheduling delay can move).
  std::function<void(std::uint64_t step)> on_first_pipeline_done = [](std::uint64_t) {};
  /// Run-ahead: when the step after a commit follows at once (no evaluation, checkpoint or join
  /// due, not the job's last step), its orders go out with the commit (run_step::commit_first,
  /// commit_step::with_run) instead of after every node acknowledged it: the commit's round trip
  /// leaves the step's critical path. Every node still applies the commit before anything of the
  /// next step. The programs turn it on; off, the step waits for the acknowledgements.
  bool run_ahead = false;
  /// Testing: at this step's commit, commit_step goes to the first node only, then `die` runs.
  std::optional<std::uint64_t> partial_commit_at;
  std::function<void()> die = [] {};
};

/// Where an admitted node stands in the job.
enum class node_state : std::uint8_t {
  registered,  ///< admitted before training, or part of a formed epoch
  joining,     ///< admitted during training: enters at the next step boundary
  lost,        ///< its monitor is gone (crash, timeout): never trusted again
};

/// One admitted node.
struct node_entry {
  std::string name;
  std::int32_t slots = 1;
  messages::endpoint data;
  messages::monitor_actor monitor;
  node_state state = node_state::registered;
  std::string lost_reason;
  std::int32_t device_index = 0;  ///< register_node::device_index
};

/// A pipeline of the current epoch.
struct running_pipeline {
  std::vector<node_id> nodes;  ///< in stage order
  std::vector<std::int32_t> stage_layers;  ///< first layer of each stage, then the end (status)
  std::int32_t first_microbatch = 0;
  std::int32_t microbatches = 0;
  messages::pipeline_actor actor;
};

/// The epoch in force (assigned, forming or formed): who is in it and what each pipeline runs.
struct epoch_layout {
  std::vector<node_id> nodes;  ///< every node assigned in this epoch (ranked or idle)
  std::vector<running_pipeline> pipelines;
  /// [pipeline][stage]: the node running it and the stage's index in that node's node_ready.
  std::vector<std::vector<std::pair<node_id, std::int32_t>>> stages;

  bool contains(node_id node) const;
};

struct coordinator_state {
  coordinator_deps deps;
  job_phase phase;  ///< where the job is; each phase's own fields live in it

  // The node registry.
  std::map<node_id, node_entry> nodes;
  node_id next_node{0};
  nonce_book nonces;
  /// Faults asked for nodes that have not joined yet: delivered to each node's monitor right after
  /// its admission, before any epoch assignment, so a fault for step K is armed before step K.
  std::map<node_id, std::vector<messages::inject_fault>> pending_faults;
  std::vector<caf::actor> subscribers;
  std::uint64_t refused = 0;  ///< registrations refused so far
  /// Lost nodes, in the order they were lost: beyond the newest lost_entries_kept, those the job
  /// no longer refers to are forgotten (coordinator.cpp, forget_old_losses).
  std::deque<node_id> lost_order;
  static constexpr std::size_t lost_entries_kept = 64;

  // Counters.
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;  ///< the step running or next to run
  std::uint64_t committed = 0;
  std::uint64_t dropped = 0;              ///< messages of another epoch, step or phase, or refused
  /// Node-side messages refused (coordinator.cpp, the gate): not from the actor the coordinator
  /// admitted or spawned for what they name, or malformed. Counted in `dropped` too.
  std::uint64_t refused_messages = 0;
  /// Refusals per sender, for the log (a line at each sender's 1st, 10th, 100th...): at most
  /// refusal_senders_named senders are named; the others share refused_from_others.
  std::map<std::string, std::uint64_t> refused_by_sender;
  std::uint64_t refused_from_others = 0;
  static constexpr std::size_t refusal_senders_named = 32;
  std::uint64_t illegal_transitions = 0;  ///< bugs: a phase entered along an edge not drawn
  int failures_without_loss = 0;  ///< failed steps or epochs since the last commit or loss
  bool eval_due = false;          ///< an evaluation round runs before the next step (or the end)
  std::uint64_t evaluations = 0;  ///< rounds finished
  std::uint64_t tied_mismatches = 0;  ///< commits after which the tied matrix's copies differed (a bug)
  static constexpr int max_failures_without_loss = 3;

  // Stage faults (coordinator_faults.cpp): strikes since the last commit, per node.
  std::map<node_id, int> errors;  ///< own stage failures
  std::map<node_id, int> stalls;  ///< named culprit of a missed deadline
  std::uint64_t commit_epoch = 0;  ///< the epoch of the last commit: older own faults are stale
  std::uint64_t probes = 0;        ///< stall probe rounds so far
  std::uint64_t evicted = 0;       ///< nodes evicted so far
  std::uint64_t first_step_of_epoch = 0;  ///< the step the epoch in force started training with
  std::uint64_t digested_epoch = 0;       ///< the last epoch a commit with digests was sent in
  std::uint64_t profile_round = 0;        ///< the profile request in force (coordinator_profiling.cpp)
  std::vector<double> recent_step_ms;     ///< wall times of the last committed steps (at most 20)

  // The epoch in force and where the layers are.
  epoch_layout current;
  planning::template_set templates;  ///< of the job, from the first plan
  planning::cluster_state formed;    ///< the last epoch that formed everywhere: where layers are
  bool formed_once = false;          ///< some epoch has formed everywhere (layers exist)
  /// The planner's predicted step for the epoch in force (job_plan::step_ms, reconfiguration::
  /// step_ms); 0 where no plan predicted it (an epoch adopted from the nodes' memory).
  double predicted_step_ms = 0;
  std::vector<node_id> lost_since_formed;
  std::vector<node_id> joining;  ///< admitted during training: enter at the next step boundary

  // Timing and metrics.
  std::chrono::steady_clock::time_point step_started;  ///< of the step in progress (or the last one)
  std::chrono::steady_clock::time_point last_commit;   ///< when the last step committed (or training began)
  std::optional<reconfiguration_record> recovering;    ///< until the first commit after it
  double last_loss = 0;
  double samples_per_second = 0;

  // Checkpoints.
  std::uint64_t checkpoint_requests = 0;
  std::string last_checkpoint;  ///< written by this run (or the one it resumed from)

  // Coordinator loss (coordinator_adoption.cpp).
  std::uint64_t term = 1;
  std::optional<restore_record> restoring;  ///< an adoption, until the first commit after it
  /// Nodes lost but not handled yet: the losses that arrive together are handled together (a
  /// coordinator that lost every node at once waits for them instead of concluding "too few").
  std::vector<node_id> unhandled_losses;
  std::uint64_t loss_checks = 0;  ///< rounds of pings after a loss; the one in force handles its losses
  /// Nodes that answered the round's ping saying they lost this coordinator too (they reached it
  /// again since): when every live node says so, this coordinator was frozen or cut off.
  std::set<node_id> lost_us;

  static inline const char* name = "oobleck.coordinator";
};

using coordinator_pointer = messages::coordinator_actor::stateful_pointer<coordinator_state>;

messages::coordinator_actor::behavior_type coordinator(coordinator_pointer self, coordinator_deps deps);

/// Spawns the coordinator. Use this rather than spawn(coordinator, ...): the actor it spawns drops
/// an exit message that does not come from an actor of its own process before CAF sees it (CAF 0.17
/// quits on exit_reason::kill from anyone, and anyone who reaches the port can send one).
messages::coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_deps deps);

/// Stops the coordinator from its own process (an exit sent by a local actor): the only exit it
/// takes, since anyone who reaches its port could send an anonymous one.
void stop_coordinator(caf::actor_system& sys, const messages::coordinator_actor& coordinator,
                      caf::exit_reason reason = caf::exit_reason::user_shutdown);

/// The status snapshot the coordinator replies with (also used by tests).
messages::job_status make_status(const coordinator_state& st);

}  // namespace oobleck::actors
