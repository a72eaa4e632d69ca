#include "support/local_run.hpp"

#include <signal.h>

#include <fstream>
#include <stdexcept>

namespace oobleck::testing {

local_run run_to_end(const std::string& program, const std::vector<std::string>& args, const std::string& metrics_path,
                     std::chrono::seconds wait, const std::function<void(background_process&)>& during) {
  background_process p(program, args);
  local_run r;
  try {
    if (during) during(p);
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
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    (j.contains("event") ? r.events : r.steps).push_back(std::move(j));
  }
  return r;
}

pid_t worker_pid(background_process& local, int node, std::chrono::milliseconds timeout) {
  const auto line = local.wait_for_line("node " + std::to_string(node) + " joined: ", timeout);
  const auto begin = line.find("joined: ") + 8;
  const std::string name = line.substr(begin, line.find(' ', begin) - begin);
  const pid_t pid = child_named(local.pid(), name);
  if (pid < 0) throw std::runtime_error("no worker process named " + name + " (node " + std::to_string(node) + ")");
  return pid;
}

}  // namespace oobleck::testing
