#pragma once
// A job on this machine for the recovery benchmark: one oobleck-coordinator and N oobleck-worker
// processes started here, the coordinator's stdout read through a pipe and every line stamped
// with this process's steady clock as it arrives (the coordinator flushes each line), so that a
// fault sent from here and the coordinator's answer are timed on one clock.

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/recovery_stats.hpp"
#include "runtime/child_process.hpp"

namespace oobleck::bench {

struct stamped_line {
  clock_type::time_point t;
  std::string text;
};

class local_cluster {
 public:
  struct options {
    std::string bin;  ///< the folder of the programs
    std::string job_text;
    int nodes = 6;
    std::int64_t steps = 20;
    int heartbeat_ms = 1000, timeout_ms = 10000;
  };

  /// Starts the coordinator and the workers and waits until every worker has joined (throws,
  /// with the coordinator's transcript, if one does not within a minute).
  explicit local_cluster(const options& o);
  /// Kills (frozen ones too) and reaps every process; removes the files unless keep_files().
  ~local_cluster();
  local_cluster(const local_cluster&) = delete;
  local_cluster& operator=(const local_cluster&) = delete;

  [[nodiscard]] std::string metrics_path() const { return (dir_ / "metrics.jsonl").string(); }
  void keep_files() { keep_ = true; }
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }

  /// Sends sig to node's process; returns the time just before.
  clock_type::time_point signal(int node, int sig);
  /// Ends node's process (a frozen one too) and reaps it.
  void kill(int node);

  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] stamped_line line(std::size_t i) const;
  [[nodiscard]] std::vector<stamped_line> lines() const;
  [[nodiscard]] std::string transcript() const;

  /// The index of the first line at or after `from` that satisfies pred, waiting up to timeout_s.
  std::optional<std::size_t> wait_for(const std::function<bool(const std::string&)>& pred, std::size_t from,
                                      double timeout_s);

  /// Asks the coordinator to shut the job down in order (SIGTERM), then waits for its exit.
  int stop(double timeout_s = 30);
  /// The coordinator's exit status (128 + signal), or -1 if it did not exit in time.
  int wait_exit(double timeout_s);

  /// The metrics file: step records and "reconfigured" records.
  void read_metrics(std::vector<nlohmann::json>& steps, std::vector<nlohmann::json>& events) const;

 private:
  runtime::child_process& process_of(int node);
  runtime::child_process& start(const std::string& program, const std::vector<std::string>& args,
                                const runtime::child_output& out);

  options o_;
  std::filesystem::path dir_;
  bool keep_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<stamped_line> lines_;
  bool eof_ = false;
  // Destroyed in this order: the processes (which closes the pipe's write end), then the reader
  // (which then sees the end), then the pipe.
  runtime::output_pipe coordinator_out_;
  std::jthread reader_;
  std::vector<runtime::child_process> processes_;  ///< the coordinator first, then the workers
  std::map<int, std::size_t> node_process_;        ///< node id -> index in processes_
};

/// "[coordinator] step K: ..." -> K.
std::optional<long long> commit_step(const std::string& l);

/// The coordinator's first word of a failure: a node lost, or an epoch formed again after a step
/// or epoch failed (when the data plane saw the crash first).
bool is_failure_notice(const std::string& l);

}  // namespace oobleck::bench
