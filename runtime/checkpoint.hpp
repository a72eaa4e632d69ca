#pragma once
// Checkpoints on disk (ARCHITECTURE.md §5 "Checkpoint"), without LibTorch: a directory per checkpoint,
// `<root>/step-NNNNNNNN/`, holding one file per layer (the layer store's serialized bytes of that
// layer: parameters, AdamW moments, step count, behind the store's checked header; each written by
// one holder) and a Cap'n Proto manifest (messages/checkpoint.capnp) with the job's trajectory
// hash, the next step, the seeds, and every file's byte count and SHA-256.
//
// Writing: begin_checkpoint makes `<root>/.tmp-step-N-...`, holders write their layer files into
// it (write_layer_file: each under a name of its own writer, fsync'd, renamed into place), finish_checkpoint writes the manifest, checks the whole
// directory, fsyncs it and renames it to `step-N` (then fsyncs the root). A crash at any point
// leaves a `.tmp-*` directory that nothing reads. Reading: read_checkpoint validates everything
// (manifest, version, job, every file's presence, size and checksum) before the caller installs
// anything, so a torn, truncated, corrupt or foreign checkpoint is refused, never half-loaded.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "messages/input_error.hpp"

namespace oobleck::runtime {

/// The manifest's formatVersion this code writes and reads.
inline constexpr std::uint32_t checkpoint_format_version = 1;
/// The manifest's file name inside a checkpoint directory.
inline constexpr const char* checkpoint_manifest_name = "manifest.capnp";

/// A checkpoint that cannot be used: missing, torn, truncated, corrupt, of another job or format.
/// `what()` names the directory or file. An input_error: programs exit 2 on it (bad input).
class checkpoint_error : public messages::input_error {
 public:
  using messages::input_error::input_error;
};

/// One layer's file, as the manifest lists it.
struct checkpoint_file {
  std::int32_t layer = 0;
  std::string name;  ///< inside the checkpoint directory: layer_file_name(layer)
  std::uint64_t bytes = 0;
  std::string sha256;  ///< lowercase hex

  bool operator==(const checkpoint_file&) const = default;
};

struct checkpoint_manifest {
  std::uint32_t format_version = checkpoint_format_version;
  std::string job_hash;  ///< the job's trajectory hash (apps: model, data, training, optimizer)
  std::uint64_t step = 0;  ///< the next step to run
  std::uint64_t model_seed = 0;
  std::uint64_t sample_seed = 0;
  std::int32_t num_layers = 0;
  std::vector<checkpoint_file> files;  ///< one per layer, by layer

  bool operator==(const checkpoint_manifest&) const = default;
};

/// The manifest as bytes (a flat Cap'n Proto message), what manifest.capnp holds.
std::vector<std::byte> manifest_to_capnp(const checkpoint_manifest& manifest);
/// Decodes manifest bytes (`origin` names them in errors) with a traversal and a nesting limit,
/// texts and numbers range-checked: malformed or hostile bytes are checkpoint_error, never a crash.
/// Nothing beyond the encoding is checked (read_manifest does).
checkpoint_manifest manifest_from_capnp(std::span<const std::byte> bytes, const std::string& origin);

/// "layer-0003.bin".
std::string layer_file_name(int layer);
/// "step-00000012": the directory name of the checkpoint whose next step is `step`.
std::string checkpoint_dir_name(std::uint64_t step);
/// Lowercase hex SHA-256 of the bytes.
std::string sha256_hex(std::span<const std::byte> bytes);

/// Creates the checkpoint directory `root` if needed; throws checkpoint_error, its text starting
/// with `named` (how the user gave it, e.g. "--checkpoint-dir DIR"), when it cannot be created or
/// written into. The coordinator calls it at start; begin_checkpoint before each checkpoint.
void ensure_checkpoint_root(const std::filesystem::path& root, const std::string& named);

/// Creates `root` if needed and a fresh temporary directory in it for the checkpoint of `step`;
/// returns its path. Throws checkpoint_error when the root cannot be written.
std::filesystem::path begin_checkpoint(const std::filesystem::path& root, std::uint64_t step);

/// "layer-0003.bin.node2.req7.a1.tmp": where writer `writer` writes layer `layer` before renaming
/// it into place. Characters of `writer` other than [A-Za-z0-9._-] become '_'; empty: "w<pid>".
std::string layer_temp_file_name(int layer, const std::string& writer);

/// Writes (and fsyncs) `bytes` as layer `layer`'s file in `dir` (a temporary checkpoint
/// directory): under layer_temp_file_name(layer, writer), renamed into place (atomic, replacing a
/// file another writer of the same layer, of the same committed state, renamed there before), and
/// the directory fsync'd; returns its manifest entry. A partial file another writer left (it died
/// mid-write) stands in nobody's way. Throws checkpoint_error on any I/O failure (the temporary
/// file is removed).
checkpoint_file write_layer_file(const std::filesystem::path& dir, int layer, std::span<const std::byte> bytes,
                                 const std::string& writer = {});

/// Completes the checkpoint in temporary directory `temp` (begin_checkpoint's): removes every file
/// the manifest does not list (writers' leftover temporary files), writes the manifest, validates the directory as read_checkpoint does, fsyncs it and renames it to
/// `<root>/step-N` (the root is temp's parent). When `step-N` exists already and is a valid
/// checkpoint of the same job (a periodic one of the same step), `temp` is removed and the
/// existing one kept. Returns the final path. Throws checkpoint_error (temp is left for a human).
std::filesystem::path finish_checkpoint(const std::filesystem::path& temp, const checkpoint_manifest& manifest);

/// Reads and validates the checkpoint in `dir`: the manifest (present, a well-formed message, this
/// format version, `job_hash`, `num_layers`, every layer exactly once under its own name), then
/// every file (present, of its byte count, of its SHA-256). Throws checkpoint_error naming the
/// directory or file and what is wrong; returns the manifest when all is well.
checkpoint_manifest read_checkpoint(const std::filesystem::path& dir, const std::string& job_hash, int num_layers);

/// The manifest of the checkpoint in `dir`, checked on its own (present, well-formed, this format
/// version, every layer 0..numLayers-1 listed once under its own name); no file is read and the
/// job is not checked. What a node reads before it installs its layers (the coordinator has run
/// read_checkpoint). Throws checkpoint_error.
checkpoint_manifest read_manifest(const std::filesystem::path& dir);

/// The bytes of one layer's file, checked against its entry (size, SHA-256) again: the files may
/// have changed since read_checkpoint. Throws checkpoint_error.
std::vector<std::byte> read_layer_file(const std::filesystem::path& dir, const checkpoint_file& entry);

/// The entry of `layer` in a validated manifest (std::out_of_range when absent).
const checkpoint_file& file_of(const checkpoint_manifest& manifest, int layer);

/// The completed checkpoint directories under `root` (named step-N, with a manifest), ascending by
/// step; temporary (.tmp-*) directories are ignored. Empty when root does not exist. Nothing is
/// validated beyond the names.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& root);

}  // namespace oobleck::runtime
