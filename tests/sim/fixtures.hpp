#pragma once
// Tiny jobs whose simulated timelines can be computed by hand.

#include <filesystem>
#include <fstream>
#include <string>

#include "sim/policy.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace oobleck::sim::testing {

/// `layers` layers of 1000 parameter bytes, forward 1000 ms and backward 2000 ms each, one GPU
/// per node, memory for everything: a one-node pipeline of L = 1 takes 3000 ms per microbatch.
inline planning::profile slow_profile(int layers, std::int64_t memory = 1 << 30) {
  planning::profile p;
  p.model = "slow" + std::to_string(layers);
  p.microbatch_size = 1;
  p.gpus_per_node = 1;
  p.device_memory_bytes = memory;
  for (int l = 0; l < layers; ++l) p.layers.push_back({"l" + std::to_string(l), {1000.0}, {2000.0}, 1000, 0});
  return p;
}

/// Oobleck and Varuna on one layer (every pipeline is one node), Bamboo on two; B = 4, b = 1, f = 1.
inline sim_job slow_job(int nodes) {
  sim_job job;
  job.profile = slow_profile(1);
  job.bamboo_profile = slow_profile(2);
  job.nodes = nodes;
  job.fault_tolerance = 1;
  job.global_batch = 4;
  job.microbatch = 1;
  job.bamboo_microbatch = 1;
  return job;
}

/// Round numbers: state of one layer is 4000 bytes; a checkpoint of it takes 1000 ms, a restart
/// 2000 + 1000 ms, detection 500 ms, planning 1000 ms, a takeover 1000 ms.
inline recovery_costs round_costs() {
  recovery_costs c;
  c.detection_ms = 500;
  c.planning_ms = 1000;
  c.copy_bytes_per_s = 4000;
  c.checkpoint_fixed_ms = 0;
  c.storage_bytes_per_s = 4000;
  c.restart_fixed_ms = 2000;
  c.load_bytes_per_s = 4000;
  c.varuna_checkpoint_every_steps = 2;
  c.bamboo_redundancy_factor = 1;
  c.bamboo_takeover_ms = 1000;
  return c;
}

/// Nodes ready the moment they are added.
inline cluster_trace instant(const std::string& text) {
  return to_cluster_trace(parse_trace(text, "test"), {.ready_delay_ms = 0});
}

/// A file in a fresh temporary directory, removed with it.
struct temp_file {
  std::filesystem::path dir, path;
  temp_file(const std::string& name, const std::string& content) {
    dir = std::filesystem::temp_directory_path() /
          ("oobleck-sim-test-" + std::to_string(std::hash<std::string>{}(name + content)) + "-" +
           std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    std::filesystem::create_directories(dir);
    path = dir / name;
    std::ofstream(path, std::ios::binary) << content;
  }
  ~temp_file() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::string str() const { return path.string(); }
};

/// The time a policy's run spent on one activity.
inline double part(const policy_result& r, activity a) { return r.breakdown_ms[static_cast<int>(a)]; }

}  // namespace oobleck::sim::testing
