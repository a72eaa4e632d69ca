#pragma once
// Profiles from outside the process: the one validation every decoded profile passes, whatever
// its encoding (JSON or Cap'n Proto), and profile files on disk.
//
// Every decoder here throws input_error (one line: the file, the key path, the problem and, for a
// cap, the limit). A value is checked before anything is sized or looped by it: a profile that
// claims 2^30 GPUs per node is refused at once, never planned.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "planning/profile.hpp"

namespace oobleck::messages {

/// The caps of a profile; each error that applies one names it.
struct profile_limits {
  static constexpr std::int64_t max_gpus_per_node = 1024;  ///< M
  static constexpr std::size_t max_layers = 4096;
  static constexpr int max_widths = 11;  ///< stage widths 1, 2, ..., 1024
  /// Per-layer parameter and activation bytes, and device memory: 256 TiB. Keeps every sum the
  /// planner forms over 4096 layers far from int64 overflow.
  static constexpr std::int64_t max_bytes = std::int64_t{1} << 48;
  static constexpr double max_layer_ms = 1e9;       ///< one layer's forward or backward time (11.6 days)
  static constexpr std::size_t max_text_bytes = 4096;  ///< model, config_hash, device_kind, layer names
  static constexpr std::size_t max_file_bytes = std::size_t{64} << 20;
};

/// Checks everything a profile must satisfy, naming the key path ("profile.layers[3].param_bytes")
/// and the limit: M a power of two up to max_gpus_per_node, 1..max_layers layers, one time per
/// stage width, times finite in [0, max_layer_ms], byte counts in [0, max_bytes], device memory in
/// [1, max_bytes], microbatch >= 1, texts valid UTF-8 without control characters, up to
/// max_text_bytes. Throws input_error.
void validate_profile(const planning::profile& p);

/// `m` as M when it is a power of two in [1, max_gpus_per_node]; input_error naming `path` otherwise.
/// Decoders call it before reading anything sized by M.
int checked_gpus_per_node(std::int64_t m, std::string_view path);

/// input_error naming `path` and the limit when a profile has no layers or more than max_layers.
void check_layer_count(std::size_t layers, std::string_view path);

/// Decodes a profile from bytes: JSON when the first non-space byte is '{', Cap'n Proto otherwise.
/// Validated (validate_profile); throws input_error.
planning::profile decode_profile(std::span<const std::byte> bytes);

/// Reads and decodes a profile file; input_error "PATH: ..." when unreadable, malformed or invalid.
planning::profile read_profile_file(const std::string& path);

/// Writes the Cap'n Proto form; throws input_error when the file cannot be written.
void write_profile_capnp(const planning::profile& p, const std::string& path);

/// Writes the JSON form (indented).
void write_profile_json(const planning::profile& p, const std::string& path);

}  // namespace oobleck::messages
