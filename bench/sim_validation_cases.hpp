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
};

/// 10m.csv (no adds after the start): the first `removed` nodes it removes and `kept` nodes it
/// never removes (file order), ending at the next removal of the trace (which is not replayed).
replay_case ten_minute_case(const std::filesystem::path& traces, const std::filesystem::path& dir, int removed,
                            int kept, double scale);

/// bamboo-p3-trace.csv up to `until_ms` (its events at or before it), on `slots` workers: the
/// nodes take the slots in the order they are added, later ones wait as spares and join when a
/// slot frees (oobleck-local --trace-nodes).
replay_case bamboo_case(const std::filesystem::path& traces, const std::filesystem::path& dir, int slots,
                        double until_ms, double scale);

}  // namespace oobleck::bench
