#pragma once
// What the recovery benchmark measures its layer copies against: the copy path over one link on
// idle cores, in this process (LibTorch: only this file of the benchmark needs it), and the host
// transport's own point-to-point bandwidth from bench/transport_vs_gloo's JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "apps/job_file.hpp"

namespace oobleck::bench {

/// The copy path itself over one link, with nothing else running: two ranks on threads of this
/// process, each with its own host transport on loopback, run their parts of a copy plan that
/// moves layers [first, end) of the job's model (full state) from rank 0 to rank 1, exactly as
/// forming stages do (actors::run_copies: the mesh connects meanwhile, the receiver tells its
/// source it is ready, the layers are received straight into pre-faulted buffers). Medians over
/// `repeats` copies, each on a new mesh: the receiver's copy time (form_timing::copies_us) and
/// its wait for the first message.
struct copy_link {
  double bytes = 0, copy_ms = 0, wait_ms = 0;
};
copy_link measure_copy_link(const apps::job_file& job, int first, int end, int repeats);

/// The host transport's point-to-point bandwidth (GB/s) at the size nearest to `bytes`, and that
/// size, from transport_vs_gloo's JSON (none if the file is missing or has no such row).
std::optional<std::pair<double, std::int64_t>> p2p_gbps(const std::string& path, double bytes);

}  // namespace oobleck::bench
