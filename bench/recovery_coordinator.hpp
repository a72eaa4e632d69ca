#pragma once
// The recovery benchmark's coordinator losses (issue 25): oobleck-local runs a short job whose
// coordinator is killed (SIGKILL in the middle of a step, or right after it decided a commit that
// reached one node only) or frozen (SIGSTOP for longer than the connection timeout), and what the
// job lost: the downtime (the coordinator_restored record's: from the nodes' last commit before
// the loss to the first commit after) and, on the coordinator's job events, where it went. A run
// has one coordinator fault, so each kind is repeated over several runs; every run's trajectory
// is checked against a failure-free run of the same job.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/recovery_faults.hpp"
#include "bench/recovery_stats.hpp"

namespace oobleck::bench {

/// One kind of coordinator fault, as oobleck-local injects it.
struct coordinator_fault {
  std::string name;   ///< for the tables: "coordinator kill -9", ...
  std::string flag;   ///< oobleck-local's flag: --kill-coordinator-at or --hang-coordinator-at
  std::string value;  ///< its value: "5", "5:commit", "5:3"
  int step = 0;       ///< the step in whose middle the fault happens
};

/// The coordinator faults the benchmark knows, at step `step`: "kill" (SIGKILL in the middle of
/// the step), "commit" (killed right after it decided the step's commit and told one node) and
/// "hang" (frozen for hang_s seconds).
coordinator_fault coordinator_fault_of(const std::string& kind, int step, double hang_s);

struct coordinator_runs {
  std::string bin;       ///< the folder of oobleck-local and the programs it starts
  std::string job_text;  ///< the job (each run gets its own copy)
  std::int64_t steps = 9;
  std::vector<coordinator_fault> faults;
  int repeats = 10;  ///< runs of each fault
};

struct coordinator_result {
  std::string kind;
  int run = 0, step = 0;
  int status = -1;            ///< oobleck-local's exit status
  double step_ms = NAN;       ///< failure-free commit interval before the fault (median)
  double downtime_ms = NAN;   ///< the coordinator_restored record's
  double bench_downtime_ms = NAN;  ///< the events: last commit before -> first commit after
  // Where the downtime goes, on the events' clock (unix ms of this machine):
  double back_ms = NAN;    ///< last commit -> the first node registered again (the fault, the
                           ///< replacement's start, the workers' reconnect period)
  double gather_ms = NAN;  ///< first -> last node back before the epoch is formed again
  double decide_ms = NAN;  ///< last node back -> epoch_forming (completing a decided commit)
  double form_ms = NAN;    ///< epoch_forming -> epoch_formed
  double rerun_ms = NAN;   ///< epoch_formed -> the first commit after
  int nodes_back = 0;      ///< node_joined events after the fault
  int lost = 0;            ///< node_lost events after the fault
  bool same_trajectory = false;  ///< every recorded step's loss and the last step's digests
  json restored;      ///< the coordinator_restored record
  json reconfigured;  ///< the "reconfigured" record of the epoch formed after the fault
  std::vector<std::string> notes;

  /// A run that did what it must: finished, restored, the failure-free trajectory.
  [[nodiscard]] bool ok() const { return status == 0 && !restored.is_null() && same_trajectory; }
};

/// A failure-free run, then `repeats` runs of each fault (interleaved: one of each kind in turn, so
/// that the machine's moments fall on every kind alike). A run that fails is kept, with notes.
std::vector<coordinator_result> run_coordinator_losses(const coordinator_runs& o);

/// The per-run table, the medians of where the downtime went, and the downtime of every kind
/// beside a worker loss's (the default job's events of `workers`).
void print_coordinator_tables(const std::vector<coordinator_result>& results, const std::vector<fault_result>& workers);

/// Every run and the summaries (median, min, max, n of each figure per kind; the worker losses'
/// downtime beside).
json coordinator_json(const coordinator_runs& o, const std::vector<coordinator_result>& results,
                      const std::vector<fault_result>& workers);

}  // namespace oobleck::bench
