#pragma once
// oobleck-coordinator's flags: what an operator (or oobleck-local, for its coordinator) gives on
// the command line, declared on a CLI11 app and read into one struct. No LibTorch.

#include <cstdint>
#include <optional>
#include <string>

#include "apps/tls.hpp"

namespace CLI {
class App;
}

namespace oobleck::apps {

struct coordinator_options {
  std::string listen;  ///< --listen HOST:PORT (required)
  std::string config;  ///< --config JOB.toml (required)
  std::string token_file = "oobleck.token";
  std::optional<int> nodes;            ///< --nodes (default: the job's cluster.nodes)
  std::optional<int> fault_tolerance;  ///< --fault-tolerance
  std::optional<std::int64_t> steps;   ///< --steps
  std::string metrics_out, events_out, address_file, http;
  std::string checkpoint_dir, resume, resume_command;
  std::optional<std::int64_t> checkpoint_every;
  tls_flags tls;              ///< --tls-*: replace the job's [tls] keys
  double adopt_wait = 10;     ///< --adopt-wait, seconds
  double grace = 60;          ///< --coordinator-grace, seconds
  std::string profile_file;   ///< --profile
  std::string profile_cache;  ///< --profile-cache
  std::optional<std::int64_t> digest_every;
  bool exit_below_minimum = false;
  std::optional<double> wait_for_nodes;  ///< seconds
  // Faults injected into the coordinator itself (hidden flags: oobleck-local and the tests).
  std::optional<std::int64_t> kill_self_at, partial_commit_at;
  std::string hang_self_at;  ///< STEP:SECONDS
};

/// Declares every flag of oobleck-coordinator on `app`, each read into its field of `o`, and the
/// help text's footer (the exit statuses).
void add_coordinator_flags(CLI::App& app, coordinator_options& o);

}  // namespace oobleck::apps
