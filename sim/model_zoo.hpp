#pragma once
// Profiles of the paper's models (Table 1: BERT-large, GPT-2, GPT-3 medium, 2.7B, 6.7B) on an
// A40-class GPU, computed from FLOPs and bytes rather than measured. A measured profile
// (oobleck-profile) replaces them wherever one exists.
//
// Formulas (b microbatch, s sequence, h hidden, a heads, V vocabulary; per microbatch):
//   forward FLOPs  block 24 b s h^2 + 4 b s^2 h (Megatron-LM's count; BERT's too: masking does not
//                  skip work); head 2 b s h V (+ 2 b s h^2 for BERT's transform layer); embedding
//                  lookups are memory-bound: 3 passes over b s h fp32 values at the memory bandwidth.
//   attention      the a s^2 b scores are memory-bound (no fused attention kernel): 8 passes of 4
//                  bytes each in the forward, at the memory bandwidth, added to each block.
//   backward       2x forward; 3x with activation checkpointing (the forward is recomputed).
//   time           FLOPs / (peak x efficiency), efficiency = max_efficiency x m / (m + half_tokens)
//                  with m = b s tokens per microbatch: small GEMMs use the GPU poorly; plus the
//                  memory-bound parts / (bandwidth x memory_efficiency).
//   parameters     block 12 h^2 + 13 h; embedding (V + s) h (+ 2 h token types for BERT); head V h + 2 h
//                  (the tied embedding is duplicated on the last stage, as Megatron-LM does), plus
//                  h^2 + h for BERT's transform; fp32 (the paper trains in TF32), 4 bytes each.
//   activations    retained per in-flight microbatch: with activation checkpointing (Oobleck and
//                  Varuna, paper §6.1) the block input, 4 b s h bytes; without (Bamboo) Megatron-LM's
//                  34 b s h + 5 a b s^2 bytes counted for fp16, doubled for fp32.
//   memory         the paper's "40GB" A40 (40 GiB), of which 90% is usable by the planner's model:
//                  the rest holds the CUDA context, allocator slack and the working set of the one
//                  layer being recomputed, none of which the planner's memory model counts.

#include <string>
#include <string_view>
#include <vector>

#include "planning/profile.hpp"
#include "sim/policy.hpp"

namespace oobleck::sim {

/// A transformer of the paper's evaluation and its Table 1 batch configuration.
struct model_spec {
  std::string name;
  int blocks = 24;
  int hidden = 1024;
  int heads = 16;
  int sequence = 1024;
  int vocab = 50257;
  bool bert = false;             ///< BERT's embedding and MLM head instead of GPT's
  int global_batch = 8192;       ///< Table 1
  int microbatch = 32;           ///< Table 1, Oobleck and Varuna
  int bamboo_microbatch = 0;     ///< Table 1 (0: "X", not runnable even with 1; we try 1)
  double parameters() const;     ///< total, in parameters
};

/// BERT-large, GPT-2 (345M), GPT-3 medium, 2.7B and 6.7B; sequences 512, 1024 and 2048.
const std::vector<model_spec>& paper_models();

/// The model of that name ("bert-large", "gpt2", "gpt3-medium", "gpt3-2.7b", "gpt3-6.7b");
/// messages::input_error listing the known names otherwise.
const model_spec& find_model(std::string_view name);

/// The GPU the profile models. Defaults: NVIDIA A40 (datasheet: 74.8 TFLOP/s dense TF32, 696 GB/s).
struct device_spec {
  std::string kind = "A40 (analytical)";
  double peak_flops = 74.8e12;
  double memory_bandwidth = 696e9;  ///< bytes/s
  double memory_bytes = 40.0 * (1LL << 30);
  double usable_memory_fraction = 0.9;
  /// Sustained fraction of peak for large GEMMs, and the tokens per microbatch at which half of it
  /// is reached. Chosen once for all five models so that Oobleck's failure-free throughput on 30
  /// nodes lands near the paper's (see bench/RESULTS.md, Table 2), not fitted per model.
  double max_efficiency = 0.41;
  double half_efficiency_tokens = 1024;
  double memory_efficiency = 0.7;         ///< of memory_bandwidth, for the embedding lookups
  double tensor_parallel_overhead = 0.08; ///< extra time per doubling of a stage's width (M > 1)
  int gpus_per_node = 1;                  ///< the paper runs one GPU per node (§6.1)
};

/// The profile of `model` at this microbatch, with or without activation checkpointing.
/// Layers: embedding, one per transformer block, head.
planning::profile analytical_profile(const model_spec& model, int microbatch, bool activation_checkpointing,
                                     const device_spec& device = {});

/// The paper's job for `model`: Table 1's batches, analytical profiles for Oobleck and Varuna
/// (activation checkpointing) and Bamboo (its microbatch, 1 where Table 1 says "X", none).
sim_job paper_job(const model_spec& model, int nodes, int fault_tolerance, const device_spec& device = {});

}  // namespace oobleck::sim
