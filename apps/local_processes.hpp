#pragma once
// The processes oobleck-local starts: the coordinator (and each replacement of it) and the workers,
// with the threads that echo their lines. The workers are copies of one oobleck-worker that loaded
// its libraries once (runtime::fork_server), unless that cannot be: then each is a program of its
// own, as it is without `fork_workers`. Its destructor ends every process before it waits for
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
#include "runtime/fork_server.hpp"

namespace oobleck::apps {

class local_processes {
 public:
  using say_fn = std::function<void(const std::string&)>;

  /// Programs are started from `bin`. Every coordinator's lines go to `say`; the workers' lines too
  /// when `echo_workers` (one pipe for them all, as under a progress bar), else to this process's
  /// own streams. Its own notes (workers started without a fork server, and why) go to `note`.
  local_processes(std::filesystem::path bin, say_fn say, bool echo_workers, bool fork_workers, say_fn note);
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
  bool fork_workers_;
  say_fn note_;
  std::optional<runtime::fork_server> fork_server_;
  std::optional<runtime::output_pipe> workers_out_;
  std::thread workers_echo_;
  std::vector<std::unique_ptr<runtime::output_pipe>> coordinator_out_;
  std::vector<std::thread> coordinator_echo_;
  std::optional<runtime::child_process> coordinator_;
  std::vector<runtime::child_process> workers_;
};

}  // namespace oobleck::apps
