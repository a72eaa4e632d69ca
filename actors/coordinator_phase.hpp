#pragma once
// The coordinator's phases as types (ARCHITECTURE.md §10): the job is in exactly one phase, a
// std::variant alternative that holds only that phase's own fields. What lives across phases (the
// node registry, the epoch in force, the step counters) stays in coordinator_state. A message is
// handled by the phase it is valid in and dropped (and counted) everywhere else, in one place
// (coordinator.cpp, dispatch). The machine, checked against `transitions` below by a test
// (coordinator_phase_test.cpp), one edge per line, `any` standing for every phase:
//
// BEGIN PHASES
//   registering -> ready          every expected node admitted, a job with no steps (admission only)
//   ready -> registering          a node lost
//   registering -> forming        every expected node admitted: the first epoch is planned and assigned
//   registering -> profiling      every expected node admitted in a job without a profile: one measures the model
//   profiling -> profiling        the node asked was lost: another one is asked
//   profiling -> registering      a node lost: fewer than the expected nodes are left
//   profiling -> forming          the profile came back: the first epoch is planned from it and assigned
//   forming -> forming            a node lost or failed while forming: planned again (the next epoch)
//   forming -> training           every node of the epoch reported node_ready
//   training -> committing        every pipeline reported pipeline_done: commit_step to every node
//   training -> forming           a node lost (loss), or a step failed without a loss (retry)
//   committing -> training        every node confirmed step_committed: the next step (or an evaluation round)
//   training -> training          an evaluation round finished: the next step
//   committing -> forming         a node lost during the commit (it stands), or nodes join at the step boundary
//   committing -> checkpointing   a periodic checkpoint is due
//   checkpointing -> training     the periodic checkpoint written, or failed (training goes on)
//   checkpointing -> forming      a node lost during a periodic checkpoint (abandoned), or nodes join
//   forming -> checkpointing      the reconfiguration policy says "checkpoint and stop"
//   training -> checkpointing     the reconfiguration policy says "checkpoint and stop"
//   committing -> checkpointing   the reconfiguration policy says "checkpoint and stop"
//   checkpointing -> checkpointing   a node lost during a periodic checkpoint, and the policy says "checkpoint and stop"
//   registering -> adopting       a node came back with the state of a job in progress (a replacement coordinator)
//   adopting -> forming           the job's committed step decided and its layers reconciled: an epoch over the nodes present
//   adopting -> registering       no node had committed a step, too few came back to plan the job, and the job waits for nodes: as at its start
//   forming -> registering        nodes lost while the first epoch formed, too few left to plan the job, and the job waits for nodes: the same
//   forming -> adopting           every node lost at once (this coordinator was frozen or cut off): wait for them to come back
//   training -> adopting          every node lost at once: wait for them to come back
//   committing -> adopting        every node lost at once (the decided commit stands): wait for them to come back
//   checkpointing -> adopting     every node lost at once during a periodic checkpoint (abandoned): wait for them
//   checkpointing -> waiting      the checkpoint before stopping written (or impossible): the job waits for nodes
//   forming -> waiting            the policy says "checkpoint and stop" with no checkpoint folder: the job waits
//   training -> waiting           the same, a loss during a step
//   committing -> waiting         the same, a loss during a commit (it stands)
//   adopting -> waiting           an adopted job below its minimum (the policy says "checkpoint and stop")
//   adopting -> checkpointing     the same in a job that does not wait for nodes: the fallback checkpoint, then the stop
//   waiting -> forming            (f + 1) x n0 nodes again: from the survivors' memory or the checkpoint
//   any -> stopped                training finished, an operator's shutdown, the fallback checkpoint
//                                 written or impossible, failures that repeat, a job that cannot be planned
// END PHASES
//
// Entering `forming` is one step (coordinator_training.cpp, enter_forming) shared by the three
// transitions that lead there: a loss, a retry and a join.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <caf/actor.hpp>

#include "actors/step_breakdown.hpp"
#include "messages/admission_messages.hpp"
#include "messages/checkpoint_messages.hpp"
#include "messages/control_messages.hpp"
#include "messages/epoch_messages.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::actors {

using planning::layer_index;
using planning::node_id;
using planning::rank;

/// A round of stall probes after a deadline: who answered what.
struct probe_round {
  std::uint64_t id = 0;
  double deadline_ms = 0;  ///< the deadline that passed
  std::map<node_id, messages::stall_report> reports;
};

/// A pipeline of a committed step: its nodes in stage order, the first layer of each stage then
/// the end (stage k holds layers [stage_layers[k], stage_layers[k + 1])), its microbatches.
struct step_pipeline {
  std::vector<node_id> nodes;
  std::vector<std::int32_t> stage_layers;
  std::int32_t microbatches = 0;
};

/// One committed step, for metrics (--metrics-out writes one JSON line each).
struct step_record {
  std::uint64_t step = 0;
  std::uint64_t epoch = 0;
  double loss = 0;  ///< mean over the global batch
  std::int64_t samples = 0;
  std::vector<step_pipeline> pipelines;
  std::map<layer_index, std::vector<std::uint64_t>> layer_digests;      ///< per layer: every holder's
  /// A tied-embedding model: the tied matrix's digest in every holder of layer 0 and of the last
  /// layer (all equal when the two copies stayed bitwise the same).
  std::vector<std::uint64_t> tied_digests;
  double grad_norm = 0;    ///< the global gradient norm, when the job clips (0 otherwise)
  double grad_scale = 1;   ///< the clipping factor the commit applied
  /// The step with nothing but its compute, gradient sum and optimizer: the slowest pipeline's
  /// 1F1B makespan from its stages' own op times plus its all-reduce wait, plus the slowest node's
  /// AdamW (0 when a stage did not report its op times). wall_ms / ideal_ms - 1 is the framework's
  /// overhead: control, waiting beyond the schedule, copies, digests.
  double ideal_ms = 0;
  /// The planner's predicted step for the epoch (coordinator_state::predicted_step_ms; 0: none).
  double predicted_ms = 0;
  double wall_ms = 0;
  step_breakdown breakdown;  ///< where wall_ms went (step_breakdown.hpp)
};

/// The step in progress, from run_step to its last step_committed.
struct step_progress {
  step_record record;
  double loss_sum = 0;
  double grad_sq = 0;  ///< pipeline 0's squared gradient norm (every replica is scaled by its factor)
  double ideal_pipeline_ms = 0;  ///< the largest pipeline_done::ideal_ms
  bool ideal_known = true;       ///< every pipeline reported one
  double slowest_optimizer_ms = 0;  ///< the largest step_committed::optimizer_ms
  step_clock timing;  ///< T0, T1 and the slowest reports
};

/// A checkpoint being written: which node writes which layers, what came back.
struct checkpoint_progress {
  std::uint64_t request = 0;
  std::uint64_t step = 0;
  std::string temp;
  std::chrono::steady_clock::time_point started;
  std::int32_t num_layers = 0;
  std::map<layer_index, std::vector<node_id>> candidates;  ///< per layer: holders not asked yet
  std::map<node_id, std::vector<layer_index>> asked;       ///< node -> layers it has not answered for
  std::vector<messages::checkpoint_layer_file> files;
  bool stop_after = false;  ///< the fallback: the job stops when it is written (or not)
  std::string reason;       ///< why the job stops
  messages::stop_outcome outcome = messages::stop_outcome::checkpoint_and_stop;  ///< how, when stop_after
  std::map<node_id, std::uint64_t> attempts;  ///< per writer: its latest order (a deadline of an older one is stale)
  std::set<node_id> failed;                   ///< writers that failed or missed a deadline: not asked again
  bool finishing = false;  ///< every layer written; the manifest and rename run off the coordinator's thread
  /// A periodic checkpoint given up for a loss (abandon_periodic_checkpoint): its directory is
  /// being discarded; it is left as soon as the loss is handled, and a stop that the loss leads to
  /// writes a checkpoint of its own rather than wait for this one.
  bool abandoned = false;
};

namespace phase {

/// Waiting for the expected nodes (again, when one is lost before training starts).
struct registering {
  static constexpr std::string_view name = "registering";
};

/// Every expected node admitted in a job with no steps: it serves status and events only.
struct ready {
  static constexpr std::string_view name = "ready";
};

/// Every expected node admitted in a job without a profile (ARCHITECTURE.md §4 "Profile at job
/// start"): one of them measures the model; the first plan waits for its profile.
struct profiling {
  static constexpr std::string_view name = "profiling";
  planning::node_id node{-1};  ///< the node asked
  std::chrono::steady_clock::time_point started;
};

/// An epoch's assignments were sent; waiting for every node of it to report node_ready.
struct forming {
  static constexpr std::string_view name = "forming";
  planning::cluster_state configuration;                         ///< what the epoch runs
  std::map<node_id, std::vector<caf::actor>> ready;   ///< node_ready so far: stage handles
  std::map<node_id, messages::form_timing> timing;    ///< node_ready so far: where forming went
  std::chrono::steady_clock::time_point assignments_sent;
  std::optional<probe_round> probing;  ///< its deadline passed: the nodes are asked what they do
};

/// A step runs: each pipeline actor drives its stages and reports pipeline_done. Or, with `eval`, an
/// evaluation round between two steps (the same protocol, forward passes only, nothing to commit).
struct training {
  static constexpr std::string_view name = "training";
  step_progress step;
  bool eval = false;
  std::size_t pipelines_pending = 0;
  std::optional<probe_round> probing;  ///< its deadline passed: the nodes are asked what they do
};

/// Every pipeline reported: the step is decided; waiting for every node's step_committed.
struct committing {
  static constexpr std::string_view name = "committing";
  step_progress step;
  std::set<node_id> pending;  ///< nodes whose step_committed has not arrived
  /// Run-ahead (coordinator_deps::run_ahead): the next step's orders went out with this commit,
  /// at `ahead_sent`; its pipelines' reports that arrive before the last acknowledgement wait in
  /// `early` and are handled once the step is in force.
  bool ahead = false;
  std::chrono::steady_clock::time_point ahead_sent;
  std::vector<messages::pipeline_done> early;
  /// Failures of that step (a stage's error, a peer it saw fail) that arrive before the last
  /// acknowledgement: handled once the commit is complete, so that its record holds the digests of
  /// every node, not of those that happened to reply first. Dropped when the commit ends otherwise
  /// (a loss, an eviction): the epoch is formed again anyway.
  std::vector<messages::node_fault> early_faults;
  /// A failure let the commit stand (commit_stands_if_decided): it is recorded and the step counter
  /// moved on. Whatever the failure's handling does next (form an epoch, or checkpoint and stop,
  /// which asks again) must not record it a second time.
  bool stood = false;
};

/// A checkpoint is being written (periodic, between steps; or the fallback before stopping).
struct checkpointing {
  static constexpr std::string_view name = "checkpointing";
  checkpoint_progress progress;
};

/// A replacement coordinator gathers the nodes that kept the job's state (ARCHITECTURE.md §10
/// "Coordinator loss"): until the nodes of the newest epoch are back or its deadline passes; then
/// nodes that did not apply the decided commit apply it from the gradients they kept.
struct adopting {
  static constexpr std::string_view name = "adopting";
  std::map<node_id, messages::node_memory> memories;  ///< nodes that came back with the job's state
  /// When each memory arrived: its ms_since_commit counts from there back to the node's last commit.
  std::map<node_id, std::chrono::steady_clock::time_point> arrived;
  std::int32_t expected = 0;  ///< nodes of the newest epoch any of them was assigned
  bool deciding = false;      ///< the wait is over: nodes complete the decided commit
  std::int64_t committed_step = -1;
  std::uint64_t committed_epoch = 0;
  std::set<node_id> completing;  ///< applying the decided commit from their kept gradients
  std::map<node_id, std::vector<messages::layer_digest>> completed;  ///< their digests after it
  std::uint64_t round = 0;  ///< the deadline in force
  std::chrono::steady_clock::time_point started;
  /// This coordinator lost every node at once and waits for them (its own job, not a replacement's).
  bool waiting = false;
  /// It was confirming a commit it had decided when it lost them: the step's progress (its loss,
  /// the digests of the nodes that had replied). Recorded once the nodes' memories show the
  /// commit was applied (the job goes on after it); dropped when the step runs again.
  std::optional<step_progress> decided;
};

/// Below the minimum (ARCHITECTURE.md §10 "Waiting for nodes"): the survivors keep their layers,
/// joining nodes are admitted, and the job resumes once `need` nodes are there; the deadline, when
/// there is one, stops it as "checkpoint and stop" would have.
struct waiting {
  static constexpr std::string_view name = "waiting";
  std::int32_t have = 0;
  std::int32_t need = 0;
  std::string reason;
  std::optional<std::string> checkpoint;  ///< written when the wait began, or the newest before it
  std::uint64_t checkpoint_step = 0;
  std::optional<std::string> written;  ///< the checkpoint written when the wait began (for the stop record)
  std::chrono::steady_clock::time_point started;
  std::uint64_t round = 0;  ///< the deadline in force
};

/// The job ended; the actor quits.
struct stopped {
  static constexpr std::string_view name = "stopped";
  messages::stop_outcome outcome = messages::stop_outcome::none;
  std::string reason;
};

}  // namespace phase

using job_phase = std::variant<phase::registering, phase::ready, phase::profiling, phase::forming, phase::training,
                               phase::committing, phase::checkpointing, phase::adopting, phase::waiting,
                               phase::stopped>;

/// A visitor of several lambdas (`std::visit(overloaded{[](phase::ready&) {...}, ...}, phase)`).
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

/// The name of the phase `p` is in.
std::string_view phase_name(const job_phase& p);

/// Every phase's name, in the variant's order.
std::vector<std::string_view> phase_names();

/// One allowed edge of the machine.
struct phase_transition {
  std::string_view from;  ///< a phase's name, or "any"
  std::string_view to;
};

/// The machine drawn above, as the code checks it: entering a phase along an edge that is not here
/// is a bug (logged and counted in coordinator_state::illegal_transitions).
inline constexpr phase_transition transitions[] = {
    {"registering", "ready"},      {"ready", "registering"},        {"registering", "forming"},
    {"registering", "adopting"},   {"adopting", "forming"},         {"adopting", "registering"},
    {"forming", "adopting"},       {"forming", "registering"},
    {"training", "adopting"},      {"committing", "adopting"},      {"checkpointing", "adopting"},
    {"forming", "forming"},        {"forming", "training"},         {"training", "committing"},
    {"training", "forming"},       {"committing", "training"},      {"committing", "forming"},
    {"committing", "checkpointing"}, {"checkpointing", "training"}, {"checkpointing", "forming"},
    {"forming", "checkpointing"},  {"training", "checkpointing"},   {"committing", "checkpointing"},
    {"checkpointing", "checkpointing"}, {"training", "training"}, {"checkpointing", "waiting"},
    {"forming", "waiting"},        {"training", "waiting"},         {"committing", "waiting"},
    {"adopting", "waiting"},       {"adopting", "checkpointing"},   {"waiting", "forming"},
    {"registering", "profiling"},
    {"profiling", "registering"},  {"profiling", "profiling"},      {"profiling", "forming"},
    {"any", "stopped"},
};

/// Whether `transitions` allows from -> to.
bool transition_allowed(std::string_view from, std::string_view to);

}  // namespace oobleck::actors
