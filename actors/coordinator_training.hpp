#pragma once
// The coordinator's training protocol (ARCHITECTURE.md §11), split from the registry and operator
// handlers in coordinator.cpp: the steps (coordinator_training.cpp: run, commit, the step boundary)
// and the epochs (coordinator_forming.cpp: the first plan, the three transitions into `forming` -
// a loss, a retry, a join - and the forming itself). Private to actors/.
//
// `handle(self, phase, message)` is the handler of a node-side message in the one phase it is
// valid in (coordinator.cpp dispatches; every other phase drops it). It returns false for a message
// of another epoch or step (fencing), which the dispatcher counts as dropped.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "actors/coordinator.hpp"
#include "actors/coordinator_checkpoint.hpp"

namespace oobleck::actors {

/// Records that the coordinator leaves its current phase for `to`; an edge the machine does not
/// draw (coordinator_phase.hpp) is a bug: logged and counted in illegal_transitions.
void check_transition(coordinator_pointer self, std::string_view to);

/// Enters phase `next` (the current phase's fields are gone afterwards).
template <class Phase>
Phase& enter(coordinator_pointer self, Phase next) {
  check_transition(self, Phase::name);
  return self->state.phase.template emplace<Phase>(std::move(next));
}

/// Milliseconds from `from` to `to`.
inline double ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

/// Publishes an event to deps.on_event and every subscriber.
void publish(coordinator_pointer self, const messages::job_event& event);

/// Ends the job: tells every live worker, publishes `stopped`, quits (with an error unless the
/// outcome is `finished` or `shutdown`).
void stop_job(coordinator_pointer self, messages::stop_outcome outcome, const std::string& reason);

/// registering -> profiling (or profiling -> profiling, when the node asked was lost): asks the
/// first live node to measure the job's model (coordinator_profiling.cpp); its profile then plans
/// the first epoch.
void start_profiling(coordinator_pointer self);
/// A node lost while profiling: another is asked, or the job waits for its nodes again.
void profiling_lost(coordinator_pointer self, phase::profiling& ph, node_id node);

/// registering -> forming: plans the job on the live nodes and assigns its first epoch (also
/// forming -> forming, when a node is lost before any epoch formed everywhere).
void plan_first_epoch(coordinator_pointer self);

/// A node of the epoch in force was lost (ARCHITECTURE.md §5 "Reconfiguration"): a commit already decided
/// stands, every survivor aborts its data plane, the reconfiguration policy decides the new
/// pipelines and the copy plan, and the uncommitted step runs again in the new epoch. During a
/// checkpoint: the fallback asks another holder; a periodic one is abandoned first.
void on_loss(coordinator_pointer self, node_id node);

/// A step or an epoch failed without a node being declared lost (yet); `failed_node` reported it.
/// The epoch is formed again (a retry), or the job stops when failures repeat without a loss.
/// `published`: the failure's step_failed event was published already (a strike).
void on_retry(coordinator_pointer self, const std::string& what, std::optional<node_id> failed_node,
              bool published = false);

/// What the reconfiguration policy says now: from the last formed configuration, with the nodes
/// lost since and the joining nodes.
planning::reconfiguration reconfigure_now(const coordinator_state& st);

/// The shared step of every transition into `forming` after the first plan: a loss (`lost_node`),
/// a retry or a join (nullopt).
void enter_forming(coordinator_pointer self, std::optional<node_id> lost_node);

/// -> training: sends step st.step to every pipeline actor of the epoch in force.
void run_step(coordinator_pointer self);

/// A failure while committing: the commit was decided before it, so it stands (recorded, and the
/// survivors apply it before anything of the next epoch). Nothing when not committing.
void commit_stands_if_decided(coordinator_pointer self, std::optional<node_id> lost_node);
/// Records step st.step, whose commit was decided and then stood through `before` (a loss, a
/// failure, this coordinator losing every node): the commit_stood event, then the step's record
/// with the digests of the nodes that replied, and st.step moves on.
void record_stood_commit(coordinator_pointer self, step_progress& progress, const std::string& before,
                         std::optional<node_id> lost_node);

/// The step boundary after a commit (and its checkpoint, if one was due): the job finishes, joined
/// nodes enter (a join: a new epoch), or the next step runs.
void after_commit(coordinator_pointer self);

// Stage faults (coordinator_faults.cpp).

/// The deadline of the step st.step (fault_policy), and of forming an epoch with that many bytes
/// of copies.
double step_deadline_ms(const coordinator_state& st);
double form_deadline_ms(const coordinator_state& st, std::int64_t copy_bytes);
/// Sets the deadline of the step in progress, of its commit, of the epoch being formed.
void arm_step_deadline(coordinator_pointer self);
void arm_commit_deadline(coordinator_pointer self);
void arm_form_deadline(coordinator_pointer self, std::int64_t copy_bytes);
/// A step committed: its wall time joins the recent ones; strikes are forgotten.
void note_committed(coordinator_pointer self, double wall_ms);
/// Declares `node` lost for `why`, tells its process to exit, and recovers without it.
void evict(coordinator_pointer self, node_id node, const std::string& why);
/// A node reported its own stage's failure: a strike; true when it was evicted for it (then the
/// recovery is under way and nothing else is to be done for this report).
bool own_failure(coordinator_pointer self, const messages::node_fault& f);
/// Whether the failures without a loss are too many to go on (the job stops as failed).
bool failures_stop_the_job(const coordinator_state& st);

bool handle(coordinator_pointer self, phase::training& ph, messages::coordinator_deadline& d);
bool handle(coordinator_pointer self, phase::training& ph, messages::stall_report& r);
bool handle(coordinator_pointer self, phase::forming& ph, messages::coordinator_deadline& d);
bool handle(coordinator_pointer self, phase::forming& ph, messages::stall_report& r);
bool handle(coordinator_pointer self, phase::committing& ph, messages::coordinator_deadline& d);

bool handle(coordinator_pointer self, phase::forming& ph, messages::node_ready& r);
bool handle(coordinator_pointer self, phase::forming& ph, messages::node_fault& f);
bool handle(coordinator_pointer self, phase::training& ph, messages::node_fault& f);
bool handle(coordinator_pointer self, phase::committing& ph, messages::node_fault& f);
bool handle(coordinator_pointer self, phase::training& ph, messages::pipeline_done& d);
bool handle(coordinator_pointer self, phase::committing& ph, messages::step_committed& c);
bool handle(coordinator_pointer self, phase::committing& ph, messages::pipeline_done& d);

// Coordinator loss (coordinator_adoption.cpp): a node that came back with the job's state, and the
// adoption's commit completions and deadline.
caf::result<messages::admission> adopt_node(coordinator_pointer self, messages::register_node& r,
                                            messages::monitor_actor monitor);
/// A node of this coordinator came back with a newer term than its own: it was replaced; it quits
/// (exit status 5 in oobleck-coordinator) and changes nothing.
void superseded(coordinator_pointer self, std::uint64_t newer_term, const std::string& who);
/// Nodes not lost.
std::int32_t live_count_of(const coordinator_state& st);
/// Marks node `id` lost for `reason`: its state, the loss order, the progress line and the
/// node_lost event; it no longer joins. What the phase does about it is the caller's.
void mark_lost(coordinator_pointer self, node_id id, std::string reason);
/// Whether every live node said, in the loss check in force, that it lost this coordinator too
/// (coordinator_state::lost_us); false when none is live.
bool every_live_node_lost_us(const coordinator_state& st);
/// The losses that arrived together: every node lost at once, or every node not lost saying it
/// lost this coordinator too, means this coordinator was frozen or cut off (not they): it waits for
/// them (adopting); otherwise each loss as before (on_loss).
void handle_losses(coordinator_pointer self);
/// A node lost while adopting.
void adoption_lost(coordinator_pointer self, phase::adopting& ph, node_id node);
bool handle(coordinator_pointer self, phase::adopting& ph, messages::step_committed& c);
bool handle(coordinator_pointer self, phase::adopting& ph, messages::coordinator_deadline& d);

// Waiting for nodes below the minimum (coordinator_waiting.cpp).
/// The policy said "checkpoint and stop" and the checkpoint was written (or could not be): with
/// deps.wait_below_minimum, the job waits for nodes instead (returns true); false: it stops.
bool wait_for_nodes(coordinator_pointer self, const checkpoint_stop_record& rec);
/// A node joined or was lost while waiting: resume when enough are there, else report the count.
void waiting_changed(coordinator_pointer self, phase::waiting& ph);
/// Every layer of the last formed configuration has a live holder (their memory is the committed state).
bool every_layer_held(const coordinator_state& st);
/// Every node of the last formed configuration that is lost counts as lost since it formed (a loss
/// not handled as a reconfiguration yet: during the fallback checkpoint, in the batch that ended
/// with a wait, or still in its ping round when a step failure re-forms the epoch).
void note_formed_losses(coordinator_state& st);
/// The step of a checkpoint directory (runtime::checkpoint_dir_name: "step-N"); nullopt otherwise.
std::optional<std::uint64_t> checkpoint_step_of(const std::string& dir);
/// The job goes on from the checkpoint in `dir` (of step `step`): planned afresh over the live
/// nodes, whose stages install their layers from it, as a resumed job's first epoch.
void resume_from_checkpoint(coordinator_pointer self, const std::string& dir, std::uint64_t step);
/// The same, unless fewer nodes than the job's minimum are live and the job waits for nodes: then
/// it waits (the phase `waiting`, `reason` saying why) and resumes from `dir` once they are there.
void resume_or_wait_from_checkpoint(coordinator_pointer self, const std::string& dir, std::uint64_t step,
                                    const std::string& reason);
/// A node lost while waiting (a survivor: its layers are gone from the job's memory).
void waiting_lost(coordinator_pointer self, phase::waiting& ph, node_id node);
bool handle(coordinator_pointer self, phase::waiting& ph, messages::coordinator_deadline& d);

/// Hands `m` to the phase in force when it has a handler for that message (every `handle` above and
/// in coordinator_checkpoint.hpp); false when it has none or its handler refused `m` (of another
/// epoch or step). The coordinator's mailbox and the replay of a step's early messages
/// (enter_ahead_round) both go through here, so they cannot disagree on who handles what. A handler
/// may enter another phase: nothing reads the old one after it returns.
template <class Message>
bool handle_in_phase(coordinator_pointer self, Message& m) {
  return std::visit(
      [&](auto& ph) -> bool {
        if constexpr (requires { handle(self, ph, m); })
          return handle(self, ph, m);
        else
          return false;
      },
      self->state.phase);
}

}  // namespace oobleck::actors
