#pragma once
// oobleck-local's flags, read and checked against each other (not yet against the job file),
// and its built-in default job. No LibTorch.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/tls.hpp"
#include "messages/control_messages.hpp"

namespace oobleck::apps {

/// oobleck-local's default job: a small GPT on the generated corpus, 6 nodes, f = 1, with the
/// slot memory set so that the model does not fit one node (n0 = 2): pipelines span nodes.
extern const char* const default_local_job;

struct local_options {
  std::optional<int> nodes;            ///< --nodes (default: the job's cluster.nodes)
  std::optional<int> fault_tolerance;  ///< --fault-tolerance
  std::optional<std::int64_t> steps;   ///< --steps
  std::string config;                  ///< --config; empty: the default job
  std::string metrics_out;
  std::string events_out;  ///< --events-out; empty: the job's events go to a scratch file only
  double timeout_s = 600;
  bool print_default_job = false;
  /// --fail-at and --hang-at, one fault per node (node ids not yet checked against the job).
  std::vector<messages::inject_fault> faults;
  std::vector<std::pair<std::int64_t, int>> joins;  ///< --join-at: (step or join_when_waiting, workers)
  std::string trace_path;
  std::optional<int> trace_nodes;
  double time_scale = 1;
  std::string checkpoint_dir, resume;
  std::optional<std::int64_t> checkpoint_every;
  tls_flags tls;  ///< --tls-*: replace the job's [tls] keys; handed on to the coordinator and workers
  /// The coordinator's own faults (its first incarnation): --kill-coordinator-at STEP[:commit] and
  /// --hang-coordinator-at STEP:SECONDS. oobleck-local restarts a coordinator that dies.
  /// One per coordinator incarnation, in order: (step, ":commit" = once its commit reached one node).
  std::vector<std::pair<std::int64_t, bool>> kill_coordinator_at;
  std::string hang_coordinator_at;             ///< "STEP:SECONDS", checked here
  double coordinator_grace_s = 60;             ///< --coordinator-grace, for every worker
  std::optional<std::int64_t> digest_every;    ///< --digest-every, passed to the coordinator
  std::string profile;                         ///< --profile, passed to the coordinator
  std::string device;                          ///< --device: the job's cluster.device instead ("cpu", "cuda")
  /// Below the minimum: --exit-below-minimum (exit 4), or wait (--wait-for-nodes SECONDS, 0: no
  /// limit; the coordinator waits by default with a checkpoint directory, and always with --trace).
  bool exit_below_minimum = false;
  std::optional<double> wait_for_nodes_s;
  /// The workers are copies of one oobleck-worker that loaded LibTorch once (runtime::fork_server);
  /// --no-fork-server: each starts as a program of its own.
  bool no_fork_server = false;
};

/// The step of a `--join-at waiting:K`: the workers start when the job first waits for nodes.
inline constexpr std::int64_t join_when_waiting = -1;

/// Reads `args` (without the program name); none when --help was printed to `out`. Throws
/// messages::input_error on a bad flag, value or combination (--time-scale without --trace,
/// --trace with --fail-at, ...).
std::optional<local_options> parse_local_options(const std::vector<std::string>& args, std::ostream& out);

}  // namespace oobleck::apps
