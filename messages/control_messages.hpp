#pragma once
// Operator-facing messages: fault injection (oobleck-ctl, oobleck-local's --fail-at / --hang-at),
// status snapshots (oobleck-ctl status, GET /status) and the events the coordinator publishes to
// subscriber actors (the extension point for users' own actors).

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "messages/wire_double.hpp"

namespace oobleck::messages {

enum class fault_kind : std::uint8_t {
  kill,   ///< the node's process SIGKILLs itself (a crash)
  hang,   ///< the node's process SIGSTOPs itself (a hang; SIGCONT after `seconds` if > 0)
  error,  ///< the node's stage throws a c10::Error ("injected: out of memory") in the step
  stall,  ///< the node's stage busy-loops inside its compute until its epoch is aborted; the
          ///< process stays responsive (heartbeats go on): only the step deadline sees it
};

/// Delivered to a node's monitor. `at_step`: in the middle of that step's compute; -1: kill and
/// hang at once, error and stall in the next step the node runs. Error and stall fire in every
/// attempt of their step (the step runs again in a new epoch after each), at most `attempts`
/// times when it is > 0.
struct inject_fault {
  std::int64_t node = -1;
  fault_kind kind = fault_kind::kill;
  std::int64_t at_step = -1;
  wire_double seconds = 0;
  std::int32_t attempts = 0;

  bool operator==(const inject_fault&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inject_fault& x) {
  return f(caf::meta::type_name("inject_fault"), x.node, x.kind, x.at_step, x.seconds, x.attempts);
}

/// One node as the coordinator sees it.
struct node_status {
  std::int64_t node = -1;
  std::string name;
  std::string state;  ///< "registered", "joining", "training", "idle", "lost"
  std::int32_t rank = -1;

  bool operator==(const node_status&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_status& x) {
  return f(caf::meta::type_name("node_status"), x.node, x.name, x.state, x.rank);
}

/// One pipeline of the current epoch: its nodes in stage order and its microbatches.
struct pipeline_status {
  std::vector<std::int64_t> nodes;
  std::vector<std::int32_t> stage_layers;  ///< first layer of each stage, then the end
  std::int32_t microbatches = 0;

  bool operator==(const pipeline_status&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pipeline_status& x) {
  return f(caf::meta::type_name("pipeline_status"), x.nodes, x.stage_layers, x.microbatches);
}

struct job_status {
  std::string state;  ///< the coordinator's phase: "registering", "ready", "forming", "training", "committing",
                      ///< "checkpointing", "adopting", "waiting", "stopped"; or "failed" (stopped by a failure)
  std::uint64_t epoch = 0;
  std::uint64_t committed_steps = 0;
  wire_double last_loss = 0;
  wire_double samples_per_second = 0;
  std::uint64_t dropped_messages = 0;  ///< stale epoch or step, from a lost node, or refused (below)
  /// Of those, refused: sent by an actor other than the one the coordinator admitted for the node
  /// (or spawned for the pipeline) the message names, or malformed (an index or size out of range).
  std::uint64_t refused_messages = 0;
  std::vector<node_status> nodes;
  std::vector<pipeline_status> pipelines;
  /// While "waiting": the nodes the job needs to go on, (f + 1) x the smallest template's (0 otherwise).
  std::int32_t nodes_needed = 0;

  bool operator==(const job_status&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_status& x) {
  return f(caf::meta::type_name("job_status"), x.state, x.epoch, x.committed_steps, x.last_loss,
           x.samples_per_second, x.dropped_messages, x.refused_messages, x.nodes, x.pipelines, x.nodes_needed);
}

/// What happened, as subscribers (and --events-out files) learn it. Programs, benchmarks and tests
/// learn what a job did from these, never from the coordinator's log lines, which are for people.
enum class event_kind : std::uint8_t {
  node_joined,         ///< node admitted; detail: its worker name
  node_lost,           ///< node declared lost; detail: why
  epoch_formed,        ///< every node of `epoch` is ready; step: the step it runs first; detail: its shape
  step_committed,      ///< `step` committed everywhere; loss: its mean loss
  stopped,             ///< the job ended; outcome: how; detail: why; committed: steps committed by this run
  epoch_forming,       ///< `epoch` assigned; lost / joined: the nodes since the last formed epoch;
                       ///< detail: the policy's rules ("" for a first plan); step: the step it runs first
  commit_stood,        ///< `step`'s commit was decided before a failure: it stands (survivors apply it)
  step_failed,         ///< `step` failed without a lost node (node: who reported it; -1: a pipeline); detail
  checkpoint_written,  ///< a checkpoint of `step` is complete; detail: its directory
  node_refused,        ///< a registration was refused; detail: the worker's name and why
  waiting_for_nodes,   ///< too few nodes to go on: the job waits for more (again at each change of
                       ///< how many there are); detail: "have H, need N: why"
  resumed,             ///< the job goes on after a wait; step: the step it runs first; detail: where its
                       ///< state comes from ("memory", or "checkpoint DIR")
};

/// How a job ended (job_event::outcome of `stopped`).
enum class stop_outcome : std::uint8_t {
  none,                 ///< not a `stopped` event
  finished,             ///< every step committed
  shutdown,             ///< an operator (or a signal) asked
  failed,               ///< it could not go on (repeated failures, cannot plan)
  checkpoint_and_stop,  ///< too few nodes or layers left: checkpoint (if possible) and stop
  superseded,           ///< a newer coordinator adopted the job (this one was frozen or cut off)
};

/// Published to every subscriber actor.
struct job_event {
  event_kind kind = event_kind::node_joined;
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::int64_t node = -1;  ///< node_joined, node_lost, step_failed
  wire_double loss = 0;    ///< step_committed
  std::string detail;
  std::vector<std::int64_t> lost;    ///< epoch_forming
  std::vector<std::int64_t> joined;  ///< epoch_forming
  stop_outcome outcome = stop_outcome::none;  ///< stopped
  std::uint64_t committed = 0;                ///< stopped: steps this run committed

  bool operator==(const job_event&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_event& x) {
  return f(caf::meta::type_name("job_event"), x.kind, x.epoch, x.step, x.node, x.loss, x.detail, x.lost, x.joined,
           x.outcome, x.committed);
}

}  // namespace oobleck::messages
