#pragma once
// GPT-like profiles from a FLOP and byte model, for benchmarks and examples where no measured
// profile exists. Not a substitute for oobleck-profile: times are modelled, not measured.

#include <cstdint>

#include "planning/profile.hpp"

namespace oobleck::planning {

struct synthetic_gpt {
  int layers = 24;  ///< total L: token+position embedding, L - 2 transformer blocks, norm + LM head
  int hidden = 2048;
  int heads = 16;
  int sequence = 1024;
  int vocab = 50257;
  int microbatch = 1;
  int gpus_per_node = 8;
  double device_tflops = 100;                       ///< sustained fp16 FLOP rate of one GPU
  std::int64_t device_memory_bytes = 40LL << 30;    ///< per GPU
  double tensor_parallel_overhead = 0.08;           ///< extra time per doubling of the stage width
};

/// Forward FLOPs 24bsh^2 + 4bs^2h per block and 2bshV for the head, backward twice forward; width d
/// divides time by d and adds `tensor_parallel_overhead` per doubling. Parameters in fp32, counted
/// as GPT-2's (runtime gpt2): embedding (V + s)h, block 12h^2 + 13h with every bias, head Vh + 2h
/// whether its matrix is its own or a tied copy of the embedding's (each stage holding it keeps a
/// copy, with gradients and optimizer state, so a tied matrix counts on both stages); oobleck-gpt
/// has 3h fewer per block. Activations 34bsh + 5as^2b bytes per block (Megatron's count).
profile synthetic_gpt_profile(const synthetic_gpt& config);

}  // namespace oobleck::planning
