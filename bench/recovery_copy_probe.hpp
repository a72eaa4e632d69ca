#pragma once
// What the recovery benchmark measures its layer copies against: the copy path over one link on
// idle cores, in this process (LibTorch: only this file of the benchmark needs it), and the host
// transport's own point-to-point bandwidth, measured here or read from bench/transport_vs_gloo's JSON.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/job_file.hpp"

namespace oobleck::bench {

/// The copy path itself over one link, with nothing else running: two ranks on threads of this
/// process, each with its own host transport on loopback, run their parts of a copy plan that
/// moves layers [first, end) of the job's model (full state) from rank 0 to rank 1, exactly as
/// forming stages do (runtime::layer_copies: the mesh connects meanwhile, the receiver tells its
/// source it is ready, the layers are received straight into pre-faulted buffers). Medians over
/// `repeats` copies, each on a new mesh: the receiver's copy time (copy_timing::copies_us) and
/// its wait for the first message.
struct copy_link {
  double bytes = 0, copy_ms = 0, wait_ms = 0;
  [[nodiscard]] double gb_per_s() const { return bytes / copy_ms / 1e6; }
};
copy_link measure_copy_link(const apps::job_file& job, int first, int end, int repeats);

/// The host transport's point-to-point bandwidth (GB/s) for one message of each of `sizes` bytes,
/// measured now on idle cores: two transports of this process on loopback
/// (runtime::measure_loopback_link: the median time of the message one way and a small reply
/// back, less a small message's round trip, so latency is not charged to it; repeats moving at
/// least ~200 MB). `rounds` rounds over every size, interleaved; each size's best round counts,
/// so that a slow moment of the machine does not lower the reference.
std::map<std::int64_t, double> measure_p2p_gbps(const std::vector<std::int64_t>& sizes, int rounds);

/// The host transport's point-to-point bandwidth (GB/s) at the size nearest to `bytes`, and that
/// size, from transport_vs_gloo's JSON (none if the file is missing or has no such row).
std::optional<std::pair<double, std::int64_t>> p2p_gbps(const std::string& path, double bytes);

}  // namespace oobleck::bench
