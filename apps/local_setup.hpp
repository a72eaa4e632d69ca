#pragma once
// What an oobleck-local run is made of, settled before any process starts (a bad job file, flag or
// trace is refused here), and the coordinator's flags that follow from it.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "apps/local_options.hpp"
#include "apps/trace_replay.hpp"

namespace oobleck::apps {

/// The job, its TLS, the trace, the counts and the paths of one run.
struct local_setup {
  std::string job_path;
  job_file job;
  tls_section tls;
  std::vector<std::string> tls_forward;  ///< the TLS flags every program of the job gets
  std::unique_ptr<trace_replayer> replay;
  int nodes = 0;
  std::int64_t steps = 0;
  int fault_tolerance = 0;
  std::string events_path;
  std::filesystem::path address_file;
  std::string token;
  std::filesystem::path bin;
};

/// Reads and checks the job (writing the default job, and the job on --device, into the scratch
/// directory `dir`), the TLS files, the trace and the faults' nodes; truncates the metrics and
/// events files. Throws messages::input_error (or the job file's error) for bad input.
local_setup prepare_local_run(const local_options& o, const std::filesystem::path& dir);

/// The coordinator's flags, the same for its every incarnation (the faults of its own are added
/// per incarnation). `args` are oobleck-local's own (the command a stop prints to resume).
std::vector<std::string> local_coordinator_args(const local_options& o, const local_setup& s,
                                                const std::vector<std::string>& args, const std::filesystem::path& dir);

}  // namespace oobleck::apps
