#pragma once
// The job's model measured on this machine: what oobleck-profile writes, and what a worker measures
// when the coordinator asks for a profile at job start (ARCHITECTURE.md §4 "Profile at job start").
// LibTorch runs behind this header (oobleck_cli_torch).

#include <optional>
#include <ostream>

#include "apps/job_file.hpp"
#include "planning/profile.hpp"
#include "runtime/device_spec.hpp"

namespace oobleck::apps {

/// How the link between two nodes enters the profile.
struct link_choice {
  bool none = false;          ///< communication between nodes is free (no link in the profile)
  double latency_ms = -1;     ///< given figures; < 0: measured on loopback (the host data plane)
  double gbytes_per_s = -1;
};

/// Every layer of the job's model at every stage width 1, 2, ..., cluster.slots_per_node
/// (forward and backward medians of `repeats` microbatches after the job's [profile] warmup,
/// parameter, activation and output bytes, one AdamW step), then the link. With `progress`, the
/// table of layers and the link's figures are printed there as they are measured. `device`: where
/// the layers run (none: the job's cluster.device, a GPU as GPU 0).
planning::profile measure_job_profile(const job_file& job, int repeats, const link_choice& link,
                                      std::ostream* progress, std::optional<runtime::device_spec> device = {});

}  // namespace oobleck::apps
