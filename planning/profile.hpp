#pragma once
// The per-layer profile every planning decision reads (ARCHITECTURE.md §4), and the checks that keep a
// wrong or stale profile from reaching the planner.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::planning {

/// Input the user can fix (bad profile, impossible job). `what()` is one line meant for the user.
class planning_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One layer: times per stage width d (index i is width 2^i), bytes of parameters and of the
/// activations autograd retains per in-flight microbatch. The last two fields are the layer's
/// share of what happens around its compute (0 where a profile does not carry them, as older
/// profile files do not): the bytes of its output per microbatch (what a stage boundary after it
/// sends forward, and its gradient back) and one AdamW step over its parameters at width 1.
struct layer_profile {
  std::string name;
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  std::int64_t param_bytes = 0;
  std::int64_t activation_bytes = 0;
  std::int64_t output_bytes = 0;
  double optimizer_ms = 0;
};

/// What moving bytes between two nodes costs: `latency_ms + bytes / bytes_per_ms` per message
/// (bytes_per_ms = 0: the bytes themselves are free). All zero (the default, and what a profile
/// without a link measurement has): p2p and all-reduce cost nothing, as in ARCHITECTURE.md §4's base model.
struct link_profile {
  double latency_ms = 0;
  double bytes_per_ms = 0;

  double message_ms(std::int64_t bytes) const {
    return latency_ms + (bytes_per_ms > 0 ? static_cast<double>(bytes) / bytes_per_ms : 0.0);
  }
  bool operator==(const link_profile&) const = default;
};

/// What a profile was measured on, plus its layers.
struct profile {
  std::string model;
  std::string config_hash;  ///< hash of the model config it was measured for; empty if unknown
  std::string device_kind;  ///< "cpu", "cuda:H100", ...; empty if unknown
  int microbatch_size = 0;
  int gpus_per_node = 0;  ///< M
  std::int64_t device_memory_bytes = 0;
  std::vector<layer_profile> layers;
  link_profile link;  ///< between two nodes (stages on one node hand off in memory, for free)

  int num_layers() const { return static_cast<int>(layers.size()); }
};

/// True for 1, 2, 4, ...
bool is_power_of_two(std::int64_t x);

/// Stage widths a node of M GPUs can give one stage: 1, 2, 4, ..., M.
std::vector<int> stage_widths(int gpus_per_node);

/// Index of width d in layer_profile::forward_ms (log2 d).
int width_index(int d);

/// Throws planning_error naming the first problem: M not a power of two, missing widths,
/// negative or non-finite times (layer or link), negative bytes, no layers, non-positive memory
/// or microbatch.
void validate(const profile& p);

/// What the job expects of its profile; unset fields are not checked.
struct profile_expectation {
  std::optional<int> microbatch_size;
  std::optional<int> gpus_per_node;
  std::optional<std::string> config_hash;
  std::optional<std::string> device_kind;
};

/// Throws planning_error when the profile was measured for another job (stale profile).
void check_matches(const profile& p, const profile_expectation& job);

}  // namespace oobleck::planning
