#pragma once
// What the recovery benchmark measures its layer copies against: the per-byte work of a copy
// outside the transport, in this process (LibTorch: only this file of the benchmark needs it), and
// the host transport's own point-to-point bandwidth from bench/transport_vs_gloo's JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "apps/job_file.hpp"

namespace oobleck::bench {

/// The per-byte work of a layer copy outside the transport, in this process (one intra-op thread):
/// serialize_layer (copy into one buffer + checksum) on the sender, install_layer (checksum +
/// copy into the store) on the receiver, and a plain memcpy of the same bytes for scale.
struct copy_path {
  double bytes = 0, serialize_ms = 0, install_ms = 0, memcpy_ms = 0;
};

/// Medians of 7 rounds on `layer` of the job's model.
copy_path measure_copy_path(const apps::job_file& job, int layer);

/// The host transport's point-to-point bandwidth (GB/s) at the size nearest to `bytes`, and that
/// size, from transport_vs_gloo's JSON (none if the file is missing or has no such row).
std::optional<std::pair<double, std::int64_t>> p2p_gbps(const std::string& path, double bytes);

}  // namespace oobleck::bench
