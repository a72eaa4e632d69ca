#pragma once
// Recovery end to end (issue 8): oobleck-local with worker processes that kill (or freeze)
// themselves in the middle of a step, workers that join during training, or workers that the test
// kills while a reconfiguration is forming. Every run checks ARCHITECTURE.md §5's "nothing lost" invariants:
//   (1) every committed step consumed exactly B samples (the pipelines' microbatches tile B/b),
//   (2) every holder of a layer reports the same parameter digest after every commit,
//   (3) the loss curve equals the failure-free single-process run (actors::train_single_process)
//       within 1e-4 relative,
// and, beyond them, that the coordinator did what the reconfiguration policy says: each
// reconfiguration it published (an epoch_forming event after the first epoch formed, with the
// nodes lost and joined since the last formed epoch and the policy's rules) is replayed through
// planning::reconfigure on the coordinator's own profile (the synthetic profile of the job's
// model), from the last configuration that formed, and must name the same rules (simple / borrow
// / merge / join ...); every committed step ran on exactly the pipelines (nodes in stage order,
// microbatches) the policy predicted for its epoch; lost nodes never appear again; a node that
// registers during training enters at the next step boundary. Everything is read from the job's
// events (--events-out) and metrics, never from log lines. Victims are chosen by asking the
// planner, so each test takes the policy path it names; the seeded chaos schedules
// (support/recovery_model) mix kills, hangs and joins. Every wait has a deadline.
//
// This header holds what the recovery_e2e_*_test.cpp files share: the job and its failure-free
// reference, one oobleck-local run, and the checks above.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/background_process.hpp"
#include "support/local_run.hpp"
#include "support/recovery_model.hpp"
#include "support/temp_dir.hpp"

namespace oobleck::testing {

/// The folder of oobleck-local, oobleck-coordinator and oobleck-worker.
extern const std::string bin;

/// A job of the default model (see recovery_model.hpp) on `nodes` nodes.
job_case make_job(int nodes, int f, std::int64_t memory, const job_keys& more = {});

/// Heartbeats for tests that freeze a process on purpose for seconds (not about detection).
extern const job_keys slow_heartbeats;

/// The failure-free run: every job here has the default model, data, batch and optimizer. At least
/// `steps` steps (a trace replay runs as many as its time allows).
const std::vector<double>& reference_losses(int steps = 12);

using run_result = local_run;

/// Runs oobleck-local on the job; `during` runs while it does (a test's own failure injection).
run_result run_local(const job_case& c, int steps, const std::vector<std::string>& extra,
                     const std::function<void(running_local&)>& during = {});

/// One reconfiguration the coordinator published: an epoch_forming event once an epoch has formed.
struct published_reconfiguration {
  std::vector<int> lost;    ///< since the last formed epoch
  std::vector<int> joined;  ///< since the last formed epoch
  std::string rules;        ///< the policy's ("" when the epoch was formed again unchanged)
  std::uint64_t epoch = 0;
};

/// What a run did, as the checks saw it.
struct run_summary {
  std::vector<published_reconfiguration> reconfigurations;  ///< also re-formations without a loss
  std::vector<published_reconfiguration> losses;            ///< those after lost nodes
  std::set<int> lost;
};

/// Every invariant of one run (see this header's comment). `victims`: the nodes the run killed.
/// `stopped`: the run was stopped (at a trace's end) rather than finishing its steps.
/// `records_lost`: steps whose metrics record and step_committed event died with a coordinator
/// killed right after deciding their commit (the one thing a coordinator loss may hide: every
/// later step's digests and loss still show that every node applied it once). A coordinator that
/// adopted the job (a coordinator_restored record) is expected: its nodes register again with it,
/// and those registrations are not joins.
run_summary check_run(const job_case& c, const run_result& r, int steps, const std::set<int>& victims,
                      bool stopped = false, const std::set<int>& records_lost = {});

/// A run with faults, checked in full. oobleck-local arms every fault before its step (the
/// coordinator delivers a node's faults on its admission), so every scheduled fault fires.
struct checked_run {
  run_result result;
  run_summary summary;
};
checked_run run_faults(const job_case& c, int steps, const std::vector<std::string>& args, const std::set<int>& scheduled,
                       const std::function<void(running_local&)>& during = {}, const std::set<int>& records_lost = {});

/// A job run as separate processes (oobleck-coordinator, then each oobleck-worker when the test
/// starts it), for tests that act on one worker from its start (freeze it, limit its memory)
/// before the others exist. The coordinator writes its events, metrics and address to a fresh
/// temporary folder.
class separate_job {
 public:
  separate_job(const job_case& c, int steps);
  /// Starts a worker named `name` (with the job's token; `extra` flags appended).
  background_process& worker(const std::string& name, const std::vector<std::string>& extra = {});
  const std::string& events() const { return events_; }
  /// Waits for the coordinator to exit (SIGTERM if it does not within `timeout`, and throws), then
  /// for every worker (30 s each); the run's status, events, metrics and every process's output.
  /// `worker_status` receives each worker's exit status by name.
  run_result finish(std::chrono::seconds timeout, std::map<std::string, int>* worker_status = nullptr);

 private:
  temp_dir tmp_;
  std::string events_, metrics_, token_, address_;
  std::unique_ptr<background_process> coordinator_;
  std::vector<std::pair<std::string, std::unique_ptr<background_process>>> workers_;
};

/// The trajectory of a run that finished `steps` steps: each committed once, in order, on B samples,
/// every layer's holders in agreement, the loss of the failure-free run within 1e-4 relative, and
/// no node of `gone` in any pipeline.
void check_trajectory(const job_case& c, const run_result& r, int steps, const std::set<int>& gone);

}  // namespace oobleck::testing
