#pragma once
// The monitor actor (ARCHITECTURE.md §5): one per worker process, the node's agent. It registers with the
// coordinator (proving the job token with the coordinator's nonce), watches the coordinator (a
// worker whose coordinator is gone says so and stops), and executes the faults operators inject.
//
//   registering --(admission)--> admitted --epoch_assignment{e}--> forming --(stage formed)-->
//        |                          ^          node_ready{e} to the coordinator      |
//        |                          +------------------------------------------------+
//        +--(refused)--> stopped (the reason is the actor's exit reason)
//   commit_step{e,k}: the node's stages apply the step; step_committed{e,k} with their digests.
//   node_ready lists one stage actor per stage the node runs (slot j runs its stage j).
//   shutdown, or the coordinator down: stopped.
//   profile_atom (before the first epoch of a job without a profile): the job's model measured on
//   this node, the profile as JSON back.
//
// The layer store, copies between epochs and abort_epoch's recovery join with fault tolerance.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <functional>
#include <optional>
#include <string>

#include <caf/stateful_actor.hpp>

#include "actors/stage.hpp"
#include "messages/actor_interfaces.hpp"

namespace oobleck::actors {

struct monitor_deps {
  messages::coordinator_actor coordinator;
  std::string token;
  std::string name;
  std::int32_t slots = 1;
  std::string device = "cpu";  ///< "cpu" or "cuda": the kind of the worker's --device (checked at admission)
  std::int32_t device_index = 0;  ///< its GPU (the N of --device cuda:N; 0 on the CPU)
  messages::endpoint data;
  std::string job_hash;  ///< of the worker's own --config, if it was given one; empty: any job
  std::function<void(const std::string&)> log = [](const std::string&) {};
  /// A refused registration ends the actor with the coordinator's error as its exit reason; a lost
/// coordinator with exit_reason::remote_link_unreachable; a shutdown normally.
/// Called once admitted, with the node id and the job's configuration.
  std::function<void(const messages::admission&)> admitted = [](const messages::admission&) {};
  /// Spawns the node's stage actors (one per slot, for the worker's life) for the admitted job
  /// (the worker decodes the job file); unset: the node cannot run stages (assignments with
  /// stages are answered with node_fault). An epoch that gives the node more stages than it has
  /// slot actors is answered with node_fault too.
  std::function<spawned_stage(const messages::admission&)> make_stage;
  /// Carries out an injected fault; the default signals this very process (SIGKILL, SIGSTOP).
  std::function<void(const messages::inject_fault&)> fault;
  /// Coordinator loss (ARCHITECTURE.md §10): one attempt to reach a coordinator (each address the
  /// worker was given, in turn); unset: a lost coordinator ends the node as before. The node keeps
  /// its layers and tries again for `grace_s` seconds, then stops.
  std::function<std::optional<messages::coordinator_actor>()> find_coordinator;
  double grace_s = 60;
  /// With find_coordinator: closes this process's connections to the coordinator's addresses and
  /// returns how many, so that the next attempt connects afresh. Called when a request over a
  /// connection that completed CAF's handshake got no answer at all (CAF 0.17 can leave a
  /// connection over which the coordinator receives requests but cannot answer:
  /// apps/coordinator_link.hpp); the node then looks again after `relink_wait`, or at the usual
  /// pace when no connection was left to close (the request went to a coordinator that had just
  /// died). Unset: it looks again over the same connection.
  std::function<std::size_t()> drop_coordinator_link;
  std::chrono::milliseconds relink_wait{1000};
  /// Once a coordinator of term `term` adopted the node: tell any older coordinator at the worker's
  /// other addresses that it was replaced (a frozen one that wakes exits, status 5).
  std::function<void(std::uint64_t term, const messages::coordinator_actor& current)> announce_term;
  /// Profile at job start (ARCHITECTURE.md §4): measures the admitted job's model on this node and
  /// returns the planning profile as JSON (throws when it cannot). It runs on the monitor's thread
  /// (the coordinator asks nothing else of a node before its first epoch). Unset: the node is
  /// asked in vain (an error back).
  std::function<std::string(const messages::admission&)> profile_job;
};

/// Where a stage's own failure is reported: the current coordinator and this node's id there
/// (both change when a replacement coordinator adopts the node).
struct failure_target {
  std::mutex mu;
  messages::coordinator_actor coordinator;
  planning::node_id node{-1};
};

struct monitor_state {
  monitor_deps deps;
  planning::node_id node{-1};  ///< -1 until admitted
  messages::admission job;
  std::uint64_t epoch = 0;  ///< the newest epoch assigned
  std::optional<spawned_stage> stage;  ///< the node's stage slots, once admitted
  std::uint64_t dropped = 0;           ///< messages of older epochs
  // What a replacement coordinator needs (node_memory).
  std::uint64_t term = 0;               ///< the newest coordinator term seen
  std::deque<messages::node_role> roles;  ///< this node's place in the newest epochs assigned
  std::int32_t job_nodes = 0;
  std::int64_t committed_step = -1;
  std::uint64_t committed_epoch = 0;
  double committed_scale = 1;
  /// A commit whose next step's orders rode with it (commit_step::with_run) and that this monitor
  /// has not answered yet: the first of the stage's nudge and slot 0's reply answers it.
  std::optional<messages::commit_step> awaiting_commit;
  std::chrono::steady_clock::time_point committed_at = std::chrono::steady_clock::now();
  /// Set while the coordinator is lost: until when to look for one.
  std::optional<std::chrono::steady_clock::time_point> orphaned_until;
  std::chrono::steady_clock::time_point orphaned_at;  ///< when it lost the coordinator
  /// The registration attempt under way (start_registration counts them): an earlier one's
  /// request can still end later (CAF 0.17 does not fail a request whose connection went away;
  /// it times out), and is then nobody's business (see start_registration).
  std::uint64_t registration_attempt = 0;
  std::shared_ptr<failure_target> failures = std::make_shared<failure_target>();
  static inline const char* name = "oobleck.monitor";
};

using monitor_pointer = messages::monitor_actor::stateful_pointer<monitor_state>;

messages::monitor_actor::behavior_type monitor(monitor_pointer self, monitor_deps deps);

/// The default fault action: SIGKILL for a kill; SIGSTOP for a hang, with a SIGCONT from a helper
/// process after `seconds` when it is positive.
void signal_own_process(const messages::inject_fault& f);

}  // namespace oobleck::actors
