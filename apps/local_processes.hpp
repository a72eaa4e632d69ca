#pragma once
// The processes oobleck-local starts: the coordinator (and each replacement of it) and the workers,
// with the threads that echo their lines. Its destructor ends every process before it waits for
// any of those threads, on every way out: a thread reading a coordinator's output ends only when
// that coordinator has exited.

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/child_process.hpp"

namespace oobleck::apps {

class local_processes {
 public:
  using say_fn = std::function<void(const std::string&)>;

  /// Programs are started from `bin`. Every coordinator's lines go to `say`; the workers' lines too
  /// when `echo_workers` (one pipe for them all, as under a progress bar), else to this process's
  /// own streams.
  local_processes(std::filesystem::path bin, say_fn say, bool echo_workers);
  /// Kills and reaps every process, then joins every echo thread.
  ~local_processes();
  local_processes(const local_processes&) = delete;
  local_processes& operator=(const local_processes&) = delete;

  /// Starts oobleck-coordinator with `args`; a coordinator started before is killed and reaped
  /// first (a replacement listens where its predecessor did). Throws child_spawn_error.
  void start_coordinator(const std::vector<std::string>& args);
  /// The coordinator started last. Only after start_coordinator.
  runtime::child_process& coordinator() { return *coordinator_; }
  /// Starts oobleck-worker with `args`; its worker number is its index in workers().
  void start_worker(const std::vector<std::string>& args);
  std::vector<runtime::child_process>& workers() { return workers_; }
  /// Waits until every coordinator's output has been echoed to its end (they have all exited).
  void join_coordinator_output();

 private:
  std::filesystem::path bin_;
  say_fn say_;
  std::optional<runtime::output_pipe> workers_out_;
  std::thread workers_echo_;
  std::vector<std::unique_ptr<runtime::output_pipe>> coordinator_out_;
  std::vector<std::thread> coordinator_echo_;
  std::optional<runtime::child_process> coordinator_;
  std::vector<runtime::child_process> workers_;
};

}  // namespace oobleck::apps
