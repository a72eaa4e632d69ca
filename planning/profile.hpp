#pragma once
// The per-layer profile every planning decision reads (DESIGN §4), and the checks that keep a
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
/// activations autograd retains per in-flight microbatch.
struct layer_profile {
  std::string name;
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  std::int64_t param_bytes = 0;
  std::int64_t activation_bytes = 0;
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

  int num_layers() const { return static_cast<int>(layers.size()); }
};

/// True for 1, 2, 4, ...
bool is_power_of_two(std::int64_t x);

/// Stage widths a node of M GPUs can give one stage: 1, 2, 4, ..., M.
std::vector<int> stage_widths(int gpus_per_node);

/// Index of width d in layer_profile::forward_ms (log2 d).
int width_index(int d);

/// Throws planning_error naming the first problem: M not a power of two, missing widths,
/// negative or non-finite times, negative bytes, no layers, non-positive memory or microbatch.
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
