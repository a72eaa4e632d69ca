#pragma once
// Node availability traces (`ms,add|remove,nodeN` per line, as in the Bamboo and Oobleck artifacts)
// and what a job sees of them: nodes that become ready and nodes that are removed, grouped by time.

#include <string>
#include <string_view>
#include <vector>

namespace oobleck::sim {

enum class trace_action { add, remove };

/// One line of a trace.
struct trace_event {
  double ms = 0;
  trace_action action = trace_action::add;
  std::string node;
  int line = 0;  ///< 1-based line in the file, for messages
};

/// Parses a trace. Blank lines are skipped; CRLF line ends are tolerated. Returns the events in the
/// order a cluster sees them: by time, adds before removes at equal times, file order otherwise.
/// Throws messages::input_error "NAME line N: ..." for a line that is not `ms,add|remove,name`
/// (ms a non-negative integer), for a node added while present and for a node removed while absent
/// (checked in that order).
std::vector<trace_event> parse_trace(std::string_view text, const std::string& name);

/// parse_trace on a file's content; an unreadable file is an input_error naming it.
std::vector<trace_event> read_trace(const std::string& path);

/// What a job sees at one time: nodes that became ready and nodes that were removed. A node that
/// is removed before it is ready is never seen at all.
struct cluster_change {
  double ms = 0;
  std::vector<int> ready;
  std::vector<int> removed;
};

struct trace_options {
  /// Time from a node's add to its readiness (the Bamboo and Oobleck artifacts' simulators use
  /// `spot_instance_creation_time = 45_000` ms). Not scaled by time_scale: it is a property of the
  /// machines, not of the trace.
  double ready_delay_ms = 45000;
  /// Multiplies every trace time (0.01 replays a 10-minute gap in 6 s), for replays on a local cluster.
  double time_scale = 1;
  /// Nodes added at the trace's first time are the job's starting cluster and ready at once; false
  /// applies the delay to them too (as the artifacts' simulators do).
  bool initial_nodes_ready = true;
};

/// A trace as a job sees it. Node ids are dense, in order of first add; a name added again after
/// its removal is a new node with a new id (node ids are never reused within a job).
struct cluster_trace {
  std::vector<cluster_change> changes;  ///< ascending ms, one entry per distinct time
  std::vector<std::string> names;       ///< names[id]
  double start_ms = 0;                  ///< first trace time (scaled)
  double end_ms = 0;                    ///< last trace time (scaled)
  int most_alive = 0;                   ///< most nodes ready at once
};

cluster_trace to_cluster_trace(const std::vector<trace_event>& events, const trace_options& options);

}  // namespace oobleck::sim
