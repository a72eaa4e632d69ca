#pragma once
// Epoch mapping (ARCHITECTURE.md §4): from a plan (pipelines on stable node ids) to what each node runs in
// one epoch, in ranks. Pure; the runtime builds its communicators from this and nothing else.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "planning/ids.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::planning {

/// One stage as the node running it sees it.
struct stage_assignment {
  int pipeline = 0;                  ///< index of its pipeline in the epoch
  int stage = 0;                     ///< position in the pipeline, 0 .. num_stages-1
  int num_stages = 0;
  layer_index first_layer;           ///< layers [first_layer, end_layer)
  layer_index end_layer;
  int first_gpu = 0;                 ///< GPUs [first_gpu, first_gpu + gpus) of its node
  int gpus = 0;
  std::optional<rank> prev;          ///< the rank running stage - 1 (none on the first stage)
  std::optional<rank> next;          ///< the rank running stage + 1 (none on the last stage)
  int microbatches = 0;              ///< its pipeline's microbatches per step
  bool operator==(const stage_assignment&) const = default;
};

/// One pipeline of the epoch: its ranks in stage order (a node's rank once per node).
struct epoch_pipeline {
  std::vector<rank> ranks;
  int microbatches = 0;
  bool operator==(const epoch_pipeline&) const = default;
};

/// Give `to` the parameters and optimizer state of `layer` from `from` (a surviving holder).
struct epoch_copy {
  layer_index layer;
  rank from;
  rank to;
  std::int64_t bytes = 0;
  bool operator==(const epoch_copy&) const = default;
};

/// What every node runs in one epoch. Ranks: the nodes of pipeline 0 in stage order, then those of
/// pipeline 1, ...; then nodes that only send copies (idle in the new configuration but the
/// chosen source of a layer), by node id. Nodes neither running a stage nor sending have no rank.
class epoch {
 public:
  int num_ranks() const { return static_cast<int>(nodes_.size()); }
  int num_layers() const { return static_cast<int>(holders_.size()); }

  node_id node(rank r) const { return nodes_.at(r.value); }
  std::optional<rank> rank_of(node_id n) const;
  /// The stages rank r runs, in pipeline order (empty for a rank that only sends copies).
  const std::vector<stage_assignment>& stages(rank r) const { return stages_.at(r.value); }
  /// Every rank holding layer l, ascending: the layer's gradient all-reduce group.
  const std::vector<rank>& holders(layer_index l) const { return holders_.at(l.value); }
  const std::vector<epoch_pipeline>& pipelines() const { return pipelines_; }
  /// The copy plan, in ranks, in the order the reconfiguration listed it.
  const std::vector<epoch_copy>& copies() const { return copies_; }

  bool operator==(const epoch&) const = default;

 private:
  friend epoch map_epoch(const template_set&, std::span<const pipeline_instance>, std::span<const layer_copy>);
  std::vector<node_id> nodes_;                         // [rank]
  std::vector<std::vector<stage_assignment>> stages_;  // [rank]
  std::vector<std::vector<rank>> holders_;             // [layer]
  std::vector<epoch_pipeline> pipelines_;
  std::vector<epoch_copy> copies_;
};

/// The epoch of pipelines (nodes in stage order, each on the template of its size) that also
/// performs `copies`. Throws std::invalid_argument when the input is not one a plan or a
/// reconfiguration produces: no templates, a pipeline without its template, a node in two
/// pipelines, a copy of a layer that does not exist, from a node that also receives it, or to a
/// node that runs no stage holding it.
epoch map_epoch(const template_set& templates, std::span<const pipeline_instance> pipelines,
                std::span<const layer_copy> copies);

/// A directed point-to-point link of an epoch's data plane: messages go from rank `from` to `to`.
struct rank_link {
  rank from;
  rank to;
  auto operator<=>(const rank_link&) const = default;
};

/// Every directed link an epoch's messages travel on, ascending and without repeats: both
/// directions between the consecutive ranks of every pipeline (activations forward, gradients
/// back, evaluation's activations), both directions between a pipeline's first and last rank (the
/// gradient of a tied embedding), and from each copy's source to its target. A rank's link to
/// itself (two stages of one node) is none: those hand over in memory. Computed from the whole
/// epoch, so every rank gets the same list: a data plane that needs a collective call per link
/// (NCCL's communicator split, runtime/nccl_communicator.hpp) makes them alike everywhere.
std::vector<rank_link> p2p_links(const epoch& e);

/// The first epoch of a job.
epoch map_epoch(const job_plan& plan);

/// The epoch after a reconfiguration; std::invalid_argument when it stops training.
epoch map_epoch(const template_set& templates, const reconfiguration& r);

}  // namespace oobleck::planning
