#pragma once
// The stage actors (ARCHITECTURE.md §5): one per slot of a worker, for the worker's whole life, detached
// (each on a thread of its own), so that LibTorch compute and blocking collectives never run on
// CAF's cooperative workers. The node's slots share one runtime: its layers across epochs in a
// layer store (parameters and AdamW state), and per epoch the data plane (host transport and
// communicator) and one stage executor per stage the node runs: a view over the stage's layer
// range of the store.
//
// Slots (the job's cluster.slots_per_node = M, the planner's M GPUs of a node, ARCHITECTURE.md §4): the
// planner gives a node consecutive stages of one pipeline whose widths d (powers of two) add up
// to M. On this CPU runtime a slot is one LibTorch intra-op thread: the stage actor of slot j
// runs the epoch's stage j of the node with d intra-op threads (set on its own thread; the BLAS
// library's threading is its own). Two adjacent stages of one node hand activations and
// gradients over in memory (runtime::loopback_communicator); stages on other nodes go over the
// transport. Slot 0 also forms the node's epochs, applies commits to every stage of the node
// (one digest list per node) and writes checkpoints.
//
//   idle --epoch_assignment{e}--> forming: the old epoch's uncommitted gradients are dropped, the
//        new mesh connects, the copy plan runs (full layer state as bytes, over the new mesh), kept
//        layers stay where they are --> formed --stage_step / commit_step--> ... --assignment{e+1}-->
//
// Messages are handled in order, so a commit decided before a failure is applied before the next
// epoch forms. abort() is callable from any thread (the monitor's): it fails every pending
// data-plane operation of epochs <= e at once, so no stage stays blocked on a dead peer.
// No LibTorch in this header.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "messages/actor_interfaces.hpp"
#include "runtime/data_source.hpp"
#include "runtime/gpt_config.hpp"
#include "runtime/optimizer_options.hpp"

namespace oobleck::actors {

/// What a stage needs of the job (the worker's composition root decodes the job file into it).
struct stage_job {
  runtime::gpt_config model;
  std::int32_t global_batch = 1;
  std::int32_t microbatch = 1;
  std::uint64_t sample_seed = 1;          ///< which samples form each step
  runtime::data_source train;              ///< the training tokens (default: the generated corpus)
  /// Held-out tokens for evaluation (kind none: no evaluation) and how many windows of them count.
  runtime::data_source validation{.kind = runtime::data_source::kind_t::none};
  std::int64_t eval_windows = 16;
  runtime::adamw_options optimizer;
  std::int32_t connect_timeout_ms = 60'000;  ///< the data plane's mesh (twice [faults] form_deadline_ms)
  bool overlap_gradient_reduce = true;  ///< runtime::executor_options::overlap_gradient_reduce
  bool shared_memory = true;            ///< runtime::transport_config::shared_memory (the job's cluster.shared_memory)
  std::int32_t spin_wait_us = 1000;     ///< runtime::transport_config::spin_wait (the job's cluster.spin_wait_us)
  /// Where the stages compute (the job's cluster.device): "cpu", or "cuda" on GPU device_index
  /// (the worker's --device cuda:INDEX). On CUDA the layer store, the optimizer state and every
  /// activation live on the GPU, and the data plane (host transport) stages device tensors
  /// through host memory.
  std::string device = "cpu";
  std::int32_t device_index = 0;
  /// The job token: the data plane's handshake proves it (over the epoch's data_nonce) and never
  /// sends it. Empty only in tests.
  std::string data_token;
};

/// A node's spawned stage slots and the handle that aborts their data plane (epochs <= the given
/// one) from any thread.
struct spawned_stage {
  /// Slot 0: forms the node's epochs (epoch_assignment), runs its first stage, applies commits
  /// and writes checkpoints.
  messages::stage_actor actor;
  /// Slots 1 .. M-1: slot j runs the node's stage j of the epoch (stage_step only).
  std::vector<messages::stage_actor> runners;
  std::function<void(std::uint64_t epoch, const std::string& reason)> abort;
  /// Arms a fault for step `f.at_step`: `act(f)` runs on the stage's thread in the middle of that
  /// step, after its compute and before it waits for its gradient all-reduce (its peers wait in
  /// collectives; with overlap some of the step's all-reduces may be under way or done). Then
  /// the stage itself throws for an `error` (a c10::Error, "injected: out of memory") and
  /// busy-loops for a `stall` until the epoch is aborted; those two stay armed for every attempt
  /// of their step (at most f.attempts when > 0); at_step -1: the next step the node runs.
  std::function<void(const messages::inject_fault& f, std::function<void(const messages::inject_fault&)> act)> arm;
  /// What the node's stages are doing now, from any thread (the stall probe's answer; probe and
  /// node are the caller's to fill). A stage stuck in compute cannot answer a message itself.
  std::function<messages::stall_report()> activity;
  /// Where the stages report a failure of their own (an exception in a step, commit or forming
  /// that is not the data plane's: out of memory, a c10::Error), from the failing stage's thread,
  /// after they aborted the epoch's data plane. Set once, before the first epoch.
  std::function<void(std::function<void(std::uint64_t epoch, const std::string& what, bool in_commit)>)>
      report_failures_to;
  /// The node's answer to commit (epoch, step) once it is applied (by the commit_step slot 0
  /// received or by the first stage whose stage_step carried it), from any thread; nullopt while
  /// it is not. `node` is left for the caller.
  std::function<std::optional<messages::step_committed>(std::uint64_t epoch, std::uint64_t step)> applied;
  /// Whether the digests of commit (epoch, step) are computed on a thread of their own (the
  /// commit rode with the next step's orders) and `applied` has not handed them out yet: an
  /// answer without them is then not the node's answer; report_commits_to's sink is called once
  /// they are ready. From any thread.
  std::function<bool(std::uint64_t epoch, std::uint64_t step)> digests_coming;
  /// Where a stage says that it applied a commit carried by its stage_step (the monitor answers
  /// the coordinator at once instead of after the step), from that stage's thread. Set once,
  /// before the first epoch.
  std::function<void(std::function<void(std::uint64_t epoch, std::uint64_t step)>)> report_commits_to;
};

/// Spawns the detached stage actors of a node of `slots` slots (a power of two, <= 64) for `job`;
/// they form on their first epoch_assignment (sent to slot 0).
spawned_stage spawn_stage(caf::actor_system& sys, const stage_job& job, int slots = 1);

/// The same training in one process, one stage holding every layer and the whole global batch
/// per step, on the job's device: what any cluster run of `job` must equal (ARCHITECTURE.md §5 "nothing lost" (3)). Returns the
/// mean loss of each step. `final_layers` (optional) receives every layer's full state after the
/// last step as the layer store serializes it (what a checkpoint's layer file holds).
std::vector<double> train_single_process(const stage_job& job, std::uint64_t steps,
                                         std::vector<std::vector<std::byte>>* final_layers = nullptr);

}  // namespace oobleck::actors
