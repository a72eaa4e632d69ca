#pragma once
// oobleck-local run to its end by a test: its exit status, what the job did (the coordinator's
// events, from `--events-out`), the metrics it wrote (one JSON line per committed step, and records
// such as "reconfigured"), and its output for people (for failure messages), with every wait bounded.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/control_messages.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"

namespace oobleck::testing {

struct local_run {
  int status = -1;
  std::string output;                         ///< what it printed, for people (and failure messages)
  std::vector<messages::job_event> events;    ///< what the job did, in order
  std::vector<nlohmann::json> steps;          ///< metrics: one per committed step
  std::vector<nlohmann::json> records;        ///< metrics: lines with an "event" key ("reconfigured", ...)
};

/// oobleck-local while it runs: its process and its coordinator's events file.
struct running_local {
  background_process& process;
  std::string events;  ///< the --events-out file

  /// The first event matching `m` (waited for; throws at the deadline or when the job stopped).
  messages::job_event wait_for(const event_match& m, std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    return wait_for_event(events, m, timeout);
  }
  /// Every event so far.
  std::vector<messages::job_event> events_so_far() const { return read_event_file(events); }
  /// The pid of worker `node` (its node id): its name from the node_joined event, its process among
  /// oobleck-local's children. Throws when there is none.
  pid_t worker_pid(int node, std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
};

/// Starts `program` (oobleck-local) with `args` plus `--events-out events`, calls `during` while it
/// runs, and waits up to `wait` for its exit; if `during` or the wait throws, the program is asked
/// to stop (SIGTERM: oobleck-local stops its coordinator and workers in order) and the exception
/// goes on. Then reads the events and `metrics` (the --metrics-out file in `args`; may be empty).
local_run run_to_end(const std::string& program, std::vector<std::string> args, const std::string& metrics,
                     const std::string& events, std::chrono::seconds wait,
                     const std::function<void(running_local&)>& during = {});

/// A metrics file: step records into `steps`, the others ("event" key) into `records`.
void read_metrics(const std::string& path, local_run& into);

}  // namespace oobleck::testing
