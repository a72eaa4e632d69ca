#pragma once
// Predicted pipeline time (ARCHITECTURE.md §4): the makespan of the 1F1B op lists of planning/schedule.hpp,
// exact for every number of microbatches. The paper's closed form (cost_model.hpp) only ranks
// templates; it is below the makespan for Nb < 4S and negative for Nb < S.

#include <memory>
#include <span>
#include <vector>

namespace oobleck::planning {

/// T(Nb) of one pipeline, Nb >= 1: nondecreasing, and never below max(sum w, Nb * w*).
///
/// Event model: stage s runs its ops in list order, one at a time; F(s, i) starts after F(s-1, i)
/// ends; B(s, i) after B(s+1, i) (on the last stage after its own F(s, i)); p2p costs nothing.
///
/// How it stays fast: put the ops of stage s (warm-up K_s = S-1-s) in "pairs" p, F(i) in pair i
/// and B(i) in pair i + K_s. Every dependency then stays in its pair or moves one pair on, and the
/// makespan is the heaviest path through a lattice that is translation-invariant between the
/// warm-up (pairs < S-1) and the cool-down (pairs >= Nb). So (a) for Nb >= S-1 the schedules of
/// Nb and Nb+1 share their first Nb pairs, and T(Nb) is the clock of each stage after pair Nb-1
/// plus a cool-down term computed once; (b) in the invariant part a heaviest path is a simple
/// path (at most 2S-1 pair steps) plus repetitions of one stage k ("dwell", w_k per pair), so for
/// Nb past the two windows T(Nb) = max_k (alpha_k + w_k * Nb). Small Nb (< S-1) are simulated.
/// Construction is O(S^3) (done once per template); evaluation is a table look-up or a few lines.
class pipeline_time {
 public:
  /// T = 0 for every Nb (no stages).
  pipeline_time();

  /// The 1F1B makespan of stages with these per-microbatch forward and backward times (ms).
  /// Precondition: equal, non-zero lengths and finite, non-negative times.
  static pipeline_time one_f_one_b(std::span<const double> forward_ms, std::span<const double> backward_ms);

  /// T(Nb) = intercept + slope * Nb, slope >= 0: synthetic pipelines for tests and benchmarks.
  static pipeline_time linear(double intercept, double slope);

  /// Predicted milliseconds for num_microbatches >= 1 microbatches.
  double at(int num_microbatches) const;

  /// The largest n in [0, most] with at(n) < limit (n = 0 always qualifies).
  int most_below(double limit, int most) const;

 private:
  struct line {
    double intercept = 0;
    double slope = 0;
  };
  struct curve {
    std::vector<double> table;  ///< table[n - 1] = T(n) for n <= table.size()
    std::vector<line> lines;    ///< T(n) = max over lines for larger n
  };
  explicit pipeline_time(std::shared_ptr<const curve> c) : curve_(std::move(c)) {}

  std::shared_ptr<const curve> curve_;  // immutable and shared: copies are cheap
};

/// The 1F1B makespan of one step as it ran: forward_ms[s][i] and backward_ms[s][i] are stage s's
/// measured times of microbatch i (every stage the same count of microbatches, >= 1), under the
/// event model above (p2p costs nothing), simulated op by op: what the step would have taken with
/// its own compute and nothing else (no control, no waiting beyond the schedule, no copies).
/// Throws std::invalid_argument on ragged, empty or negative input.
double one_f_one_b_makespan(const std::vector<std::vector<double>>& forward_ms,
                            const std::vector<std::vector<double>>& backward_ms);

}  // namespace oobleck::planning
