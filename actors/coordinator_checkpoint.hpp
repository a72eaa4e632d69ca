#pragma once
// The coordinator's checkpoints (ARCHITECTURE.md §13), split from the training protocol. One holder
// of each layer writes that layer's file (the state of the last committed step) into a temporary
// directory on the shared filesystem; the holders are spread so that each writes a similar number
// of layers; a holder that no longer has a layer, is lost while writing, answers with an error or
// misses its deadline is replaced by another holder of its layers (the checkpoint fails only when a
// layer has no holder left that could write it); once every layer is written, the composition
// root's `finish` writes the manifest and renames the directory. `begin`, `finish` and `discard`
// run in a helper actor (detached when deps.checkpoint.off_thread), so the coordinator keeps
// answering while a large checkpoint is hashed and fsync'd. Private to actors/. In the phase
// machine (coordinator_phase.hpp):
//
//   committing --(next step % every == 0)--> checkpointing --(written or failed)--> next step
//   the policy says stop, the job fails, an operator's shutdown --checkpoint or SIGTERM
//     --> checkpointing (stop_after) --(written / impossible)--> stopped
//
// A writer's deadline: deps.checkpoint.write_floor + 3 x (the parameter bytes of the layers asked
// of it, from the profile) / deps.checkpoint.write_bytes_per_second.

#include <cstdint>
#include <optional>
#include <string>

#include "actors/coordinator.hpp"

namespace oobleck::actors {

/// After a commit: starts a periodic checkpoint when one is due (returns true; training goes on
/// once it is written), else returns false.
bool maybe_periodic_checkpoint(coordinator_pointer self);

/// The policy said "checkpoint and stop" (`reason` says why): when a checkpoint directory is
/// configured and every layer has a surviving holder, the survivors write a checkpoint of the last
/// committed step; then (or at once, when none can be written) the job stops: what happened and
/// the resume command are logged, deps.checkpoint.on_stop is called, and the coordinator quits.
void checkpoint_and_stop(coordinator_pointer self, const std::string& reason);

/// The job stops with `outcome` (failed, shutdown, checkpoint_and_stop) because `reason`: first,
/// when a checkpoint directory is configured, an epoch has formed and every layer has a live
/// holder, a checkpoint of the last committed step is written (a periodic one in progress becomes
/// it); then the job stops, its log and stop reason naming the checkpoint, or saying why none was
/// written. A second call while it is written changes nothing (an operator's plain shutdown stops
/// at once).
void stop_after_checkpoint(coordinator_pointer self, messages::stop_outcome outcome, const std::string& reason);

/// A writer's deadline passed (checkpoint_deadline, sent to itself): when that order is still
/// unanswered, the writer is named in the log and its layers go to other holders.
void on_checkpoint_deadline(coordinator_pointer self, const messages::checkpoint_deadline& d);

bool handle(coordinator_pointer self, phase::checkpointing& ph, messages::checkpoint_written& w);

/// A checkpoint before a stop lost a writer: another holder writes its layers, or the job stops
/// without a checkpoint.
void fallback_writer_lost(coordinator_pointer self, phase::checkpointing& ph, node_id node);

/// A periodic checkpoint is abandoned (its temporary directory removed) because `why`; the caller
/// then leaves the phase (a reconfiguration).
void abandon_periodic_checkpoint(coordinator_pointer self, phase::checkpointing& ph, const std::string& why);

}  // namespace oobleck::actors
