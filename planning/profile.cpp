#include "planning/profile.hpp"

#include <cmath>
#include <sstream>

namespace oobleck::planning {

bool is_power_of_two(std::int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::vector<int> stage_widths(int gpus_per_node) {
  std::vector<int> widths;
  // 64-bit: with M = 2^30 a doubling int would overflow and never end the loop.
  for (std::int64_t d = 1; d <= gpus_per_node; d *= 2) widths.push_back(static_cast<int>(d));
  return widths;
}

int width_index(int d) {
  int i = 0;
  while ((1 << i) < d) ++i;
  return i;
}

namespace {

[[noreturn]] void fail(const std::string& what) { throw planning_error("invalid profile: " + what); }

void check_times(const layer_profile& layer, int index, const std::vector<double>& times,
                 const char* kind, std::size_t widths) {
  if (times.size() != widths) {
    std::ostringstream os;
    os << "layer " << index << " (" << layer.name << ") has " << kind << " times for " << times.size()
       << " stage widths, expected " << widths << " (1.." << (1 << (widths - 1)) << ")";
    fail(os.str());
  }
  for (std::size_t i = 0; i < times.size(); ++i) {
    if (!std::isfinite(times[i]) || times[i] < 0) {
      std::ostringstream os;
      os << "layer " << index << " (" << layer.name << ") " << kind << " time at width " << (1 << i)
         << " is " << times[i] << "; times must be finite and >= 0";
      fail(os.str());
    }
  }
}

}  // namespace

void validate(const profile& p) {
  if (!is_power_of_two(p.gpus_per_node))
    fail("gpus_per_node is " + std::to_string(p.gpus_per_node) + ", must be a power of two >= 1");
  if (p.microbatch_size <= 0)
    fail("microbatch_size is " + std::to_string(p.microbatch_size) + ", must be >= 1");
  if (p.device_memory_bytes <= 0)
    fail("device_memory_bytes is " + std::to_string(p.device_memory_bytes) + ", must be > 0");
  if (p.layers.empty()) fail("no layers");
  if (p.layers.size() > 4096) fail("more than 4096 layers");
  const auto widths = stage_widths(p.gpus_per_node).size();
  for (int l = 0; l < p.num_layers(); ++l) {
    const auto& layer = p.layers[l];
    check_times(layer, l, layer.forward_ms, "forward", widths);
    check_times(layer, l, layer.backward_ms, "backward", widths);
    if (layer.param_bytes < 0 || layer.activation_bytes < 0 || layer.output_bytes < 0)
      fail("layer " + std::to_string(l) + " (" + layer.name + ") has negative byte counts");
    if (!std::isfinite(layer.optimizer_ms) || layer.optimizer_ms < 0)
      fail("layer " + std::to_string(l) + " (" + layer.name + ") optimizer time is " +
           std::to_string(layer.optimizer_ms) + "; times must be finite and >= 0");
  }
  for (const auto& [name, value] : {std::pair{"latency_ms", p.link.latency_ms}, {"bytes_per_ms", p.link.bytes_per_ms}})
    if (!std::isfinite(value) || value < 0)
      fail(std::string("link ") + name + " is " + std::to_string(value) + "; it must be finite and >= 0");
}

void check_matches(const profile& p, const profile_expectation& job) {
  auto stale = [&](const std::string& field, const std::string& has, const std::string& wants) {
    throw planning_error("profile of '" + p.model + "' does not match the job: it was measured with " +
                         field + " = " + has + ", the job uses " + wants + "; re-run oobleck-profile");
  };
  if (job.microbatch_size && *job.microbatch_size != p.microbatch_size)
    stale("microbatch_size", std::to_string(p.microbatch_size), std::to_string(*job.microbatch_size));
  if (job.gpus_per_node && *job.gpus_per_node != p.gpus_per_node)
    stale("gpus_per_node", std::to_string(p.gpus_per_node), std::to_string(*job.gpus_per_node));
  if (job.config_hash && *job.config_hash != p.config_hash)
    stale("config_hash", p.config_hash.empty() ? "(none)" : p.config_hash, *job.config_hash);
  if (job.device_kind && *job.device_kind != p.device_kind)
    stale("device_kind", p.device_kind.empty() ? "(none)" : p.device_kind, *job.device_kind);
}

}  // namespace oobleck::planning
