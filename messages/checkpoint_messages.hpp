#pragma once
// Writing a checkpoint from the cluster (ARCHITECTURE.md §5 "Checkpoint"). The checkpoint directory is on a
// filesystem every node shares (as for any multi-host trainer); the coordinator makes a temporary
// directory in it, asks one holder of each layer to write that layer's file, and once every file is
// reported (byte count, SHA-256) writes the manifest and renames the directory.
//
//   coordinator                         monitor ---------------> stage (the node's layers)
//     | -- write_checkpoint{r, dir} -->   | -- write_checkpoint --> | writes its listed layers
//     | <-------- checkpoint_written{r} --------------------------- |   (missing: not held)

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "planning/ids.hpp"

namespace oobleck::messages {

/// Write the listed layers' files (the state of the last committed step) into `dir`.
struct write_checkpoint {
  std::uint64_t request = 0;  ///< the coordinator's id of this checkpoint; replies carry it back
  std::uint64_t step = 0;     ///< the next step: the layers hold steps 0..step-1
  std::string dir;            ///< the temporary checkpoint directory (absolute, shared)
  std::vector<planning::layer_index> layers;
  /// Unique to this writer and attempt ("node2.req7.a1"): each file is written under a temporary
  /// name with it and renamed into place, so a writer that died mid-write never blocks another.
  std::string writer;

  bool operator==(const write_checkpoint&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, write_checkpoint& x) {
  return f(caf::meta::type_name("write_checkpoint"), x.request, x.step, x.dir, x.layers, x.writer);
}

/// One layer file written: what the manifest lists.
struct checkpoint_layer_file {
  planning::layer_index layer;
  std::uint64_t bytes = 0;
  std::string sha256;  ///< lowercase hex

  bool operator==(const checkpoint_layer_file&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_layer_file& x) {
  return f(caf::meta::type_name("checkpoint_layer_file"), x.layer, x.bytes, x.sha256);
}

/// A node's answer to write_checkpoint: the files it wrote (renamed into place), the layers it does
/// not hold, and an error (I/O) for the layers it could not write: the coordinator asks another
/// holder of every layer neither written nor missing.
struct checkpoint_written {
  std::uint64_t request = 0;
  planning::node_id node;
  std::vector<checkpoint_layer_file> files;
  std::vector<planning::layer_index> missing;
  std::string error;

  bool operator==(const checkpoint_written&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_written& x) {
  return f(caf::meta::type_name("checkpoint_written"), x.request, x.node, x.files, x.missing, x.error);
}

/// The coordinator's deadline for one checkpoint writer's answer (a delayed_send to itself; from
/// anyone else it is dropped): when `attempt` of `node` for checkpoint `request` is still
/// unanswered, its layers go to other holders.
struct checkpoint_deadline {
  std::uint64_t request = 0;
  planning::node_id node;
  std::uint64_t attempt = 0;

  bool operator==(const checkpoint_deadline&) const = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_deadline& x) {
  return f(caf::meta::type_name("checkpoint_deadline"), x.request, x.node, x.attempt);
}

}  // namespace oobleck::messages
