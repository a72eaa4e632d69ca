#include "sim/recovery_costs.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "messages/input_error.hpp"

namespace oobleck::sim {

using messages::input_error;

recovery_costs parse_recovery_costs(const std::string& text, const std::string& name, const recovery_costs& base) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw input_error(name + ": not JSON: " + e.what());
  }
  if (!doc.is_object()) throw input_error(name + ": expected a JSON object");
  recovery_costs c = base;
  c.source = name;
  auto number = [&](const std::string& key, const nlohmann::json& v, double min, bool strict) {
    if (!v.is_number()) throw input_error(name + ": " + key + " must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < min || (strict && x <= min))
      throw input_error(name + ": " + key + " must be " + (strict ? "> " : ">= ") + std::to_string(min));
    return x;
  };
  const std::map<std::string, std::function<void(const nlohmann::json&)>> fields = {
      {"detection_ms", [&](const auto& v) { c.detection_ms = number("detection_ms", v, 0, false); }},
      {"planning_ms", [&](const auto& v) { c.planning_ms = number("planning_ms", v, 0, false); }},
      {"copy_bytes_per_s", [&](const auto& v) { c.copy_bytes_per_s = number("copy_bytes_per_s", v, 0, true); }},
      {"checkpoint_fixed_ms", [&](const auto& v) { c.checkpoint_fixed_ms = number("checkpoint_fixed_ms", v, 0, false); }},
      {"storage_bytes_per_s", [&](const auto& v) { c.storage_bytes_per_s = number("storage_bytes_per_s", v, 0, true); }},
      {"restart_fixed_ms", [&](const auto& v) { c.restart_fixed_ms = number("restart_fixed_ms", v, 0, false); }},
      {"load_bytes_per_s", [&](const auto& v) { c.load_bytes_per_s = number("load_bytes_per_s", v, 0, true); }},
      {"varuna_checkpoint_every_steps",
       [&](const auto& v) {
         if (!v.is_number_integer() || v.template get<long long>() < 1 || v.template get<long long>() > 1000000)
           throw input_error(name + ": varuna_checkpoint_every_steps must be an integer in [1, 1000000]");
         c.varuna_checkpoint_every_steps = v.template get<int>();
       }},
      {"bamboo_redundancy_factor",
       [&](const auto& v) { c.bamboo_redundancy_factor = number("bamboo_redundancy_factor", v, 0, false); }},
      {"bamboo_takeover_ms", [&](const auto& v) { c.bamboo_takeover_ms = number("bamboo_takeover_ms", v, 0, false); }},
      {"snapshot_bytes_per_s",
       [&](const auto& v) { c.snapshot_bytes_per_s = number("snapshot_bytes_per_s", v, 0, true); }},
      {"checkpoint_interval_s",
       [&](const auto& v) { c.checkpoint_interval_s = number("checkpoint_interval_s", v, 0, false); }},
      {"spare_groups",
       [&](const auto& v) {
         if (!v.is_number_integer() || v.template get<long long>() < 0 || v.template get<long long>() > 1000000)
           throw input_error(name + ": spare_groups must be an integer in [0, 1000000]");
         c.spare_groups = v.template get<int>();
       }},
      {"source",
       [&](const auto& v) {
         if (!v.is_string()) throw input_error(name + ": source must be a string");
         c.source = name + " (" + v.template get<std::string>() + ")";
       }},
      {"measured", [](const auto&) {}},
  };
  for (const auto& [key, value] : doc.items()) {
    const auto it = fields.find(key);
    if (it == fields.end()) throw input_error(name + ": unknown key '" + key + "'");
    it->second(value);
  }
  return c;
}

recovery_costs frontier_recovery_costs() {
  recovery_costs c;
  // Detection, for every policy alike: a crashed process closes its connections at once (22 ms
  // measured by bench/recovery), but a GPU that hangs (the commonest fault at scale: Llama 3's
  // Table 5 puts GPU and HBM3 faults at over half of 419 interruptions) is found by a timeout.
  // 10 s: the cluster programs' default heartbeat timeout (cluster.connection_timeout_ms).
  c.detection_ms = 10000;
  // Oobleck's reconfiguration and a replica group's quorum, beyond detection: the decision itself
  // (15 ms measured on the local cluster, bench/results/recovery.json) is nothing next to forming
  // the new epoch's communicators over thousands of GPUs. 30 s: MegaScale (Jiang et al., NSDI
  // 2024, section 4.3) brought the initialisation of a 12,288-GPU job, NCCL communicators
  // included, to under 30 s; re-forming communicators costs no more than that.
  c.planning_ms = 30000;
  // Layer copies between nodes: 8 x 400 Gb/s NICs per node = 400 GB/s (Llama 3's fabric, 400 Gb/s
  // per GPU), of which a quarter: copies share the NICs with the other pipelines' traffic and our
  // data plane stages them through the host. An assumption, not a measurement (bench/recovery
  // measures loopback on 2 cores, which says nothing about InfiniBand).
  c.copy_bytes_per_s = 100e9;
  // Checkpoints to Tectonic (Llama 3, section 3.3.1: 2 TB/s sustained, 7 TB/s peak), reading at
  // the same rate on a restart. No fixed cost on a write: the asynchronous write is a background
  // transfer.
  c.checkpoint_fixed_ms = 0;
  c.storage_bytes_per_s = 2e12;
  c.load_bytes_per_s = 2e12;
  // A restart of the whole job: the scheduler replaces the failed node from the spare pool and
  // every process starts again (Python, CUDA contexts, the model, NCCL over all GPUs, the data
  // loader). MegaScale measured 1,047 s for the initialisation of a 12,288-GPU job before its
  // optimisations and < 30 s after; 300 s is an assumption between the two for a run that has
  // invested in fast restarts (bench/sim_scale also prints the result at 30 s and 1,047 s).
  c.restart_fixed_ms = 300000;
  c.source = "frontier defaults (sim/recovery_costs.cpp: frontier_recovery_costs)";
  return c;
}

recovery_costs read_recovery_costs(const std::string& path, const recovery_costs& base) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read recovery-costs file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_recovery_costs(text.str(), path, base);
}

}  // namespace oobleck::sim
