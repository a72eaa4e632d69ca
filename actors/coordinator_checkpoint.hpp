#pragma once
// The coordinator's checkpoints (ARCHITECTURE.md §13), split from the training protocol. One holder
// of each layer writes that layer's file (the state of the last committed step) into a temporary
// directory on the shared filesystem; the holders are spread so that each writes a similar number
// of layers; a holder that no longer has a layer (or is lost while writing) is replaced by another;
// once every layer is written, the composition root's `finish` writes the manifest and renames the
// directory. Private to actors/. In the phase machine (coordinator_phase.hpp):
//
//   committing --(next step % every == 0)--> checkpointing --(written or failed)--> next step
//   the policy says stop --> checkpointing (stop_after) --(written / impossible)--> stopped

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

bool handle(coordinator_pointer self, phase::checkpointing& ph, messages::checkpoint_written& w);

/// The fallback checkpoint lost a writer: another holder writes its layers, or the job stops
/// without a checkpoint.
void fallback_writer_lost(coordinator_pointer self, phase::checkpointing& ph, node_id node);

/// A periodic checkpoint is abandoned (its temporary directory removed) because `why`; the caller
/// then leaves the phase (a reconfiguration).
void abandon_periodic_checkpoint(coordinator_pointer self, phase::checkpointing& ph, const std::string& why);

}  // namespace oobleck::actors
