#pragma once
// The cluster programs' commands (composition roots call them through run_program):
//   oobleck-coordinator --listen HOST:PORT --config JOB.toml [--token-file FILE] [--nodes N]
//                       [--steps K] [--http HOST:PORT] [--metrics-out FILE]
//   oobleck-worker --coordinator HOST:PORT --token-file FILE [--name NAME] [--slots K] ...
//   oobleck-ctl --coordinator HOST:PORT --token-file FILE status [--json] | kill-node ID |
//               hang-node ID [--seconds S] | shutdown [--reason TEXT]

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

int run_coordinator_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
/// Exit status: 0 shut down by the coordinator, 2 refused (bad token, job or version) or bad
/// flags, 3 the coordinator went away.
int run_worker_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
/// Runs a coordinator and --nodes workers on this machine; the coordinator's exit status.
int run_local_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int run_ctl_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
