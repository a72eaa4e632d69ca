#include "support/local_run.hpp"

#include <signal.h>

#include <fstream>
#include <stdexcept>

namespace oobleck::testing {

pid_t running_local::worker_pid(int node, std::chrono::milliseconds timeout) const {
  const std::string name = worker_name(events, node, timeout);
  const pid_t pid = child_named(process.pid(), name);
  if (pid < 0) throw std::runtime_error("no worker process named " + name + " (node " + std::to_string(node) + ")");
  return pid;
}

void read_metrics(const std::string& path, local_run& into) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    (j.contains("event") ? into.records : into.steps).push_back(std::move(j));
  }
}

local_run run_to_end(const std::string& program, std::vector<std::string> args, const std::string& metrics,
                     const std::string& events, std::chrono::seconds wait,
                     const std::function<void(running_local&)>& during) {
  args.insert(args.end(), {"--events-out", events});
  background_process p(program, args);
  running_local running{p, events};
  local_run r;
  try {
    if (during) during(running);
    r.status = p.wait_exit(wait);
  } catch (...) {
    p.signal(SIGTERM);
    try {
      p.wait_exit(std::chrono::seconds(20));
    } catch (...) {
    }
    throw;
  }
  r.output = p.output();
  r.events = read_event_file(events);
  if (!metrics.empty()) read_metrics(metrics, r);
  return r;
}

}  // namespace oobleck::testing
