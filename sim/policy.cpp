#include "sim/policy.hpp"

namespace oobleck::sim {

double state_bytes(const planning::profile& p, double state_factor) {
  double bytes = 0;
  for (const auto& l : p.layers) bytes += static_cast<double>(l.param_bytes);
  return bytes * state_factor;
}

double restart_ms(const recovery_costs& c, double bytes) { return c.restart_fixed_ms + bytes / c.load_bytes_per_s * 1e3; }

double checkpoint_ms(const recovery_costs& c, double bytes) {
  return c.checkpoint_fixed_ms + bytes / c.storage_bytes_per_s * 1e3;
}

}  // namespace oobleck::sim
