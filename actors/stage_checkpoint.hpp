#pragma once
// The stage's part of checkpoints (ARCHITECTURE.md §5 "Checkpoint"): writing the layers it holds into a
// checkpoint directory, and installing a resumed job's layers from one. Private to the stage
// library; no LibTorch in this header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/gpt_config.hpp"

#include "messages/checkpoint_messages.hpp"

namespace oobleck::runtime {
class layer_store;
}

namespace oobleck::actors {

/// Writes the file of every layer of `order` that `store` holds (its committed state: gradients
/// are not state) into order.dir; layers not held are listed as missing. An I/O failure is the
/// reply's error. Never throws.
messages::checkpoint_written write_checkpoint_layers(const runtime::layer_store& store,
                                                     const messages::write_checkpoint& order);

/// Replaces layers [first, end) of `store` with their state in the checkpoint in `dir`: every
/// file is read and checked (size, SHA-256) before the first layer is installed, so a torn or
/// corrupt file changes nothing; the store then checks each layer's own header. Throws runtime::checkpoint_error or
/// runtime::layer_install_error naming the file.
void install_from_checkpoint(runtime::layer_store& store, const std::string& dir, planning::layer_index first,
                             planning::layer_index end);

/// One layer's state as numbers (tests compare replicas and checkpoints with a tolerance).
struct layer_state_values {
  std::vector<float> parameters;  ///< every parameter, concatenated
  std::vector<float> exp_avg;     ///< AdamW's first moments, likewise
  std::vector<float> exp_avg_sq;  ///< second moments
  std::int64_t step = 0;          ///< AdamW updates applied
};

/// Decodes layer `layer`'s serialized state (a checkpoint's layer file, or layer_store bytes) of
/// `model`. Throws runtime::layer_install_error on bytes of another layer or model.
layer_state_values decode_layer_state(const runtime::gpt_config& model, planning::layer_index layer,
                                      std::span<const std::byte> bytes);

}  // namespace oobleck::actors
