#pragma once
// A job on this machine for the recovery benchmark: one oobleck-coordinator and N oobleck-worker
// processes started here. The benchmark learns what the job does from the coordinator's job
// events (--events-out, read as the file grows: bench/job_events.hpp), its address from
// --address-file, and its figures from --metrics-out; the coordinator's output goes to a file
// that is only shown to people (in errors). A fault sent from here is timed on the events' clock:
// the system clock read just before the signal (unix ms), against the event's unix_ms.

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/job_events.hpp"
#include "bench/recovery_stats.hpp"
#include "runtime/child_process.hpp"

namespace oobleck::bench {

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
  /// with the coordinator's output, if one does not within a minute).
  explicit local_cluster(const options& o);
  /// Kills (frozen ones too) and reaps every process; removes the files unless keep_files().
  ~local_cluster();
  local_cluster(const local_cluster&) = delete;
  local_cluster& operator=(const local_cluster&) = delete;

  [[nodiscard]] std::string metrics_path() const { return (dir_ / "metrics.jsonl").string(); }
  void keep_files() { keep_ = true; }
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }

  /// Sends sig to node's process; returns the system clock (unix ms) read just before.
  double signal(int node, int sig);
  /// Ends node's process (a frozen one too) and reaps it.
  void kill(int node);

  /// The coordinator's events read so far (events().read() for the latest).
  [[nodiscard]] event_log& events() { return *events_; }
  /// The index of the first event at or after `from` that satisfies pred, waiting up to timeout_s
  /// (none once the coordinator has exited without one).
  std::optional<std::size_t> wait_for(const std::function<bool(const timed_event&)>& pred, std::size_t from,
                                      double timeout_s);
  /// The coordinator's output (for people: errors show it).
  [[nodiscard]] std::string transcript() const;

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
  bool coordinator_alive();

  options o_;
  std::filesystem::path dir_;
  bool keep_ = false;
  std::unique_ptr<event_log> events_;
  std::vector<runtime::child_process> processes_;  ///< the coordinator first, then the workers
  std::map<int, std::size_t> node_process_;        ///< node id -> index in processes_
};

/// The coordinator's first word of a failure: a node lost, or a step or epoch failed without a
/// loss (when the data plane saw the crash first), which it answers by forming the epoch again.
bool is_failure_notice(const timed_event& e);

}  // namespace oobleck::bench
