#pragma once
// Hugging Face GPT-2 weights in and out of our layers (runtime/hf_gpt2.hpp names them): a layer's
// parameters from model.safetensors ([model] init), and a whole model to model.safetensors +
// config.json (oobleck-export).

#include <torch/torch.h>

#include <string>
#include <vector>

#include "runtime/gpt_config.hpp"
#include "runtime/safetensors.hpp"

namespace oobleck::runtime {

class layer_store;

/// Overwrites `parameters` (layer l's, in registration order) with the tensors of `file` under
/// their Hugging Face names, transposing Conv1D weights; the tied head copy reads
/// transformer.wte.weight. Throws std::invalid_argument naming the tensor and the file when one is
/// missing, of another shape, or not F32/F16/BF16.
void load_hf_layer(const safetensors_file& file, const gpt_config& c, int layer,
                   const std::vector<torch::Tensor>& parameters);

/// Layer l of `c` built from its seed and then overwritten from `dir`/model.safetensors: what a
/// layer store does for [model] init.
void load_hf_layer(const std::string& dir, const gpt_config& c, int layer, const std::vector<torch::Tensor>& parameters);

/// Writes `dir`/model.safetensors (F32, Hugging Face names and layouts; the tied matrix once, from
/// layer 0; {"format": "pt"} metadata) and `dir`/config.json from a store that holds every layer of
/// a gpt2 model. Creates `dir`. Throws std::invalid_argument for another architecture.
void export_hf(const layer_store& store, const std::string& dir);

}  // namespace oobleck::runtime
