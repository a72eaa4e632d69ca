#pragma once
// The coordinator's checkpoints (DESIGN §5 "Checkpoint"), split from the training protocol. One
// holder of each layer writes that layer's file (the state of the last committed step) into a
// temporary directory on the shared filesystem; the holders are spread so that each writes a
// similar number of layers; a holder that no longer has a layer (or is lost while writing) is
// replaced by another; once every layer is written, the composition root's `finish` writes the
// manifest and renames the directory. Private to actors/.
//
//   committing --(next step % every == 0)--> checkpointing --(written or failed)--> next step
//   recover: policy says stop --> checkpointing (stop_after) --(written / impossible)--> stopped

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

void on_checkpoint_written(coordinator_pointer self, messages::checkpoint_written& w);

/// A node was lost (or the epoch failed) while a checkpoint is being written. The fallback
/// checkpoint absorbs it (another holder writes the lost node's layers, or the job stops without
/// a checkpoint) and true is returned; a periodic checkpoint is abandoned (its temporary directory
/// removed) and false is returned: the caller recovers as usual.
bool checkpoint_interrupted(coordinator_pointer self, std::optional<std::int64_t> lost_node);

}  // namespace oobleck::actors
