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

// --- A frontier-scale model (issue 27): the 16,384-GPU run ---
//
// `dense-400b`: a dense decoder of Llama 3 405B's shape (Dubey et al., "The Llama 3 Herd of
// Models", 2024, Table 3: 126 layers, model dimension 16,384, 128 heads, vocabulary 128,256,
// sequence 8,192) on 8-GPU H100 nodes, generated from the same kind of formulas as the paper's
// models above. Assumptions, each a simplification a user should know:
//   parameters     12 h^2 + 13 h per block (GPT's count; Llama's GQA + SwiGLU block has 3.19e9
//                  against our 3.22e9, within 1%); untied embedding and head of V h each; 4.1e11 in
//                  all. bf16 weights (2 bytes each) and 16 bytes of training state per parameter
//                  (bf16 weights and gradients, fp32 master weights and two Adam moments), i.e. the
//                  job's state factor is 8. No ZeRO/FSDP sharding: every pipeline holds the whole
//                  state of its layers, as Oobleck's planner assumes.
//   layers         126 profile layers, one per block; the embedding lookup is folded into the first
//                  and the final norm and head into the last (so the planner sees L = 126, the size
//                  issue 27's planner targets; Llama 3 itself balances its first and last stages).
//   time           forward FLOPs 24 b s h^2 + 4 b s^2 h per block (fused attention: no memory-bound
//                  score passes), 2 b s h V for the head, at peak x efficiency with the same
//                  efficiency curve as above; backward 3x forward (activation checkpointing).
//   GPU            H100 SXM (datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s, 80 GB), 8 per node with
//                  tensor parallelism inside a node (the zoo's per-doubling overhead); efficiency
//                  0.45 x m / (m + 1024) = 40% at 8,192 tokens, the middle of the 38-43% BF16 MFU
//                  Llama 3 reports on 8-16K H100s (its Table 4).
//   link           8 x 400 Gb/s InfiniBand per node (Llama 3's RoCE fabric and most H100 clusters
//                  run 400 Gb/s per GPU): 400 GB/s per node, 5 us per message.
//   optimizer      AdamW streams ~28 bytes per parameter (weights, gradient, master, two moments
//                  read and written) at 70% of one GPU's memory bandwidth, at width 1.
//   batch          one 8,192-token sequence per node per step (global batch = nodes, microbatch 1):
//                  2,048 sequences = 16M tokens at 2,048 nodes, Llama 3's batch at that scale,
//                  and the same microbatches per pipeline at 128 and 512 nodes (weak scaling).
model_spec frontier_model();
device_spec frontier_device();
/// Its profile (activation checkpointing, microbatch b).
planning::profile frontier_profile(int microbatch = 1);
/// The job on `nodes` 8-GPU nodes: the batch above, state factor 8, Bamboo's profile the same one
/// (Bamboo is not compared at this scale).
sim_job frontier_job(int nodes, int fault_tolerance);

}  // namespace oobleck::sim
