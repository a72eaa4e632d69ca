#pragma once
// A trace replayed on a local cluster of a few worker processes: which of the trace's nodes get a
// worker, when a worker is killed (the node's removal) and when one is started (a later node
// taking a free slot: a join). oobleck-local --trace and bench/recovery replay it; the simulator
// gets the same node subset back as a trace (replay_trace) so that both see the same cluster.
//
// The cluster has `slots` workers at most. Nodes take free slots in the order the trace adds them
// (file order at equal times); a node added while every slot is taken waits as a spare and takes
// the next slot that frees, at the time it frees (as oobleck-sim's --nodes grants spares). At one
// trace time, adds are seen first, then removes, then free slots are filled: a node added and
// removed at the same time never gets a worker. Workers are numbered in order of their start:
// the starting ones 0..k-1 (the nodes that have a slot at the trace's first time), later ones the
// next numbers (as oobleck-local --join-at numbers its joined workers).

#include <string>
#include <vector>

#include "sim/trace.hpp"

namespace oobleck::sim {

/// One trace time at which the local cluster changes.
struct replay_event {
  double ms = 0;                       ///< trace time minus the trace's first time (unscaled)
  std::vector<std::string> removed;    ///< trace nodes removed: their workers are killed
  std::vector<int> killed;             ///< ... those workers (parallel to `removed`)
  std::vector<std::string> added;      ///< trace nodes that take a slot now: new workers (joins)
  std::vector<int> started;            ///< ... the new workers' numbers (parallel to `added`)
};

struct replay_options {
  int slots = 6;
  /// Later nodes take free slots (joins). False: only the nodes that have a slot at the trace's
  /// first time are replayed (their removals), every later add is ignored.
  bool joins = true;
};

struct replay_schedule {
  std::vector<std::string> initial;  ///< worker i runs trace node initial[i] from the start
  std::vector<replay_event> events;  ///< ascending ms; each kills or starts at least one worker
  double end_ms = 0;                 ///< the trace's last time minus its first (unscaled)
  int adds_without_slot = 0;         ///< nodes that never got a worker (ignored, or spares removed or left waiting)
  int removes_without_worker = 0;    ///< removals of such nodes (nothing to kill)
  int workers() const;               ///< workers started in all
};

/// The schedule of `events` (parse_trace's order). Throws messages::input_error when slots < 1
/// or the trace is empty.
replay_schedule make_replay_schedule(const std::vector<trace_event>& events, const replay_options& options);

/// The node subset the local cluster replays, as a trace (times relative to the trace's first,
/// unscaled; a node that takes a slot later is added at that time): what the simulator needs to
/// see the same cluster (its end is the schedule's end_ms, which a trace cannot carry).
std::vector<trace_event> replay_trace(const replay_schedule& schedule);

/// One line for each event: "trace 2040 s: remove node3 (kill worker 2); add node7 (start worker 6)".
std::string describe(const replay_event& e);

}  // namespace oobleck::sim
