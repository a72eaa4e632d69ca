#pragma once
// The recovery benchmark's fault scenarios: a job on the local cluster, a worker killed (SIGKILL)
// or frozen (SIGSTOP) half a failure-free step after a commit, and what the recovery cost: from the
// coordinator's job events (their unix_ms against the system clock read just before the signal)
// and from its "reconfigured" metrics record.

#include <signal.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/recovery_stats.hpp"

namespace oobleck::bench {

struct fault_plan {
  int step = 0;  ///< the fault happens in this step, half a failure-free step after step-1 committed
  int node = 0;
  int sig = SIGKILL;
};

struct scenario {
  std::string name;
  std::string job_name;
  std::string job_text;
  int nodes = 6;
  std::int64_t steps = 20;
  int heartbeat_ms = 1000, timeout_ms = 10000;
  std::vector<fault_plan> faults;
};

struct fault_result {
  std::string scenario, job, kind, heartbeat;
  int node = 0, step = 0;
  int workers_after = 0;            ///< worker processes still running once this fault's node is gone
  double step_ms = 0;               ///< failure-free step: median commit interval before the fault
  double fault_after_commit_ms = 0;
  double detect_ms = NAN;           ///< fault -> first failure notice (node_lost or step_failed event)
  double loss_notice_ms = NAN;      ///< fault -> the node_lost event of the faulted node
  double resume_ms = NAN;           ///< fault -> first step_committed event after it
  double bench_downtime_ms = NAN;   ///< last commit before -> first commit after (the events' clock)
  double resumed_step_ms = NAN;     ///< the re-run step's own time (its metrics wall_ms)
  json record;                      ///< the coordinator's "reconfigured" record
  std::int64_t predicted_bytes = -1, busiest_bytes = -1;
  int copies = 0;
  bool plan_matches = false;
  /// The host transport's p2p bandwidth (GB/s) for one message of busiest_bytes, measured in the
  /// same run (0: unknown): what the busiest link's copy is measured against.
  double p2p_gb_per_s = 0;
  std::vector<std::string> notes;
};

/// Runs one scenario from the programs in `bin`; counts losses of nodes nobody faulted in
/// spurious_losses. Throws (keeping the job's files) when the job does not do what it must.
std::vector<fault_result> run_scenario(const std::string& bin, const scenario& s, int& spurious_losses);

/// Every figure of one fault.
json result_json(const fault_result& r);

/// A figure of the coordinator's record (NaN: no record, or not in it).
double record_ms(const fault_result& r, const char* key);
/// An event whose copy bandwidth can be figured: a record, a busiest link and a copy time.
bool has_copy(const fault_result& r);
/// The busiest link's bytes over the slowest node's copy time, GB/s (NaN without a record).
double busiest_gbps(const fault_result& r);
/// Every link's bytes over the slowest node's copy time, GB/s (NaN without a record).
double all_links_gbps(const fault_result& r);
/// The downtime the target allows: detection + one failure-free step + the copy (the record's
/// copy_ms) + 0.5 s (NaN without a record).
double downtime_bound_ms(const fault_result& r);
/// Whether every worker left after the fault had a core of this machine to itself (as each node has
/// its own hardware on a cluster); otherwise they shared the cores while forming and copying.
bool own_cores(const fault_result& r);
/// This machine's cores (std::thread::hardware_concurrency, at least 1).
int machine_cores();

}  // namespace oobleck::bench
