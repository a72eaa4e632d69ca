#pragma once
// oobleck-local run to its end by a test: its output, exit status and the metrics it wrote (one
// JSON line per committed step, and event records such as "reconfigured"), with every wait bounded.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/background_process.hpp"

namespace oobleck::testing {

struct local_run {
  int status = -1;
  std::string output;
  std::vector<nlohmann::json> steps;   ///< one per committed step
  std::vector<nlohmann::json> events;  ///< lines with an "event" key
};

/// Starts `program` with `args`, calls `during` while it runs, and waits up to `wait` for its exit;
/// if `during` or the wait throws, the program is asked to stop (SIGTERM: oobleck-local stops
/// its coordinator and workers in order) and the exception goes on. Then reads `metrics_path`.
local_run run_to_end(const std::string& program, const std::vector<std::string>& args, const std::string& metrics_path,
                     std::chrono::seconds wait, const std::function<void(background_process&)>& during = {});

/// The pid of worker `node` (its node id) of a running oobleck-local: its name from the
/// coordinator's "node ID joined: NAME" line, its process among oobleck-local's children.
/// Throws when there is none.
pid_t worker_pid(background_process& local, int node,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace oobleck::testing
