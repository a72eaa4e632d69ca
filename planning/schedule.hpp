#pragma once
// The 1F1B pipeline schedule as data (ARCHITECTURE.md §4): executors interpret the op list and never do
// schedule arithmetic.

#include <string>
#include <vector>

namespace oobleck::planning {

enum class op_kind {
  recv_activation,  ///< from stage s - 1 (not on the first stage)
  forward,
  send_activation,  ///< to stage s + 1 (not on the last stage)
  recv_gradient,    ///< from stage s + 1 (not on the last stage)
  backward,
  send_gradient,    ///< to stage s - 1 (not on the first stage)
};

struct schedule_op {
  op_kind kind;
  int microbatch;
  bool operator==(const schedule_op&) const = default;
};

/// Ops of stage s (0-based) of S for m microbatches: min(S - s - 1, m) warm-up forwards, then
/// one-forward-one-backward, then cool-down backwards; each compute op wrapped in the transfers
/// it needs. Sends are posted, not awaited: a transport must buffer them (no rendezvous).
std::vector<schedule_op> one_f_one_b(int stage, int num_stages, int num_microbatches);

const char* to_string(op_kind k);

}  // namespace oobleck::planning
