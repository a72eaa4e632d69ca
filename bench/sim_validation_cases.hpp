#pragma once
// The simulator validation's cases: node subsets of the traces in ../shared/traces, written as
// trace files of their own that oobleck-local replays and the simulator predicts.

#include <filesystem>
#include <string>

namespace oobleck::bench {

/// A case: a trace file (a node subset of one of ../shared/traces, written to the scratch folder)
/// replayed on `slots` workers at `scale`.
struct replay_case {
  std::string name;
  std::string source;  ///< the trace it comes from
  std::string how;     ///< how the subset was taken
  std::filesystem::path trace;  ///< the file both replay
  int slots = 0;
  double scale = 0;
  int fault_tolerance = 0;  ///< f of the replay and the prediction; 0: the job's
};

/// 10m.csv (no adds after the start): the first `removed` nodes it removes and `kept` nodes it
/// never removes (file order), ending at the next removal of the trace (which is not replayed).
replay_case ten_minute_case(const std::filesystem::path& traces, const std::filesystem::path& dir, int removed,
                            int kept, double scale);

/// Where the traces are absent (a clone without ../shared/traces): a trace written here in the shape
/// of ten_minute_case(2 removed, 4 kept), so that a smoke run still replays and predicts something.
/// Six nodes from the start, one removed at 601.2 s and another at 1202.4 s (10m.csv's removals
/// come every 601.2 s), the window ending at 1803.6 s.
replay_case synthetic_case(const std::filesystem::path& dir, double scale);

/// bamboo-p3-trace.csv up to `until_ms` (its events at or before it), on `slots` workers: the
/// nodes take the slots in the order they are added, later ones wait as spares and join when a
/// slot frees (oobleck-local --trace-nodes).
replay_case bamboo_case(const std::filesystem::path& traces, const std::filesystem::path& dir, int slots,
                        double until_ms, double scale);

/// bamboo-p3-trace.csv from `from_ms` to `until_ms` (its last event at or before it ends the
/// window): the nodes present at from_ms are the starting cluster (in the order the trace added
/// them), its events after from_ms follow at their times minus from_ms; replayed on `slots`
/// workers (spares join when a slot frees) with f = `fault_tolerance`.
replay_case bamboo_window_case(const std::filesystem::path& traces, const std::filesystem::path& dir, int slots,
                               double from_ms, double until_ms, double scale, int fault_tolerance);

}  // namespace oobleck::bench
