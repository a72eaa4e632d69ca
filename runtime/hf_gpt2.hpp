#pragma once
// Our GPT-2 layers' parameters under Hugging Face's names, and its config.json (GPT2Config), without
// LibTorch. Parameters are listed in each layer's registration order (runtime/gpt_model.cpp); a
// Linear weight of ours is [out, in] where Hugging Face's Conv1D holds [in, out]: `transposed`.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/gpt_config.hpp"

namespace oobleck::runtime {

/// One parameter of one of our layers: its Hugging Face tensor name, its shape in our layout, and
/// whether Hugging Face stores its transpose (Conv1D weights).
struct hf_parameter {
  std::string name;
  std::vector<std::int64_t> shape;
  bool transposed = false;
};

/// Layer l's parameters of a gpt2 model, in registration order (layer 0: wte, wpe; a block:
/// ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj; the head: the tied wte copy (named
/// transformer.wte.weight), ln_f, or ln_f and lm_head.weight when untied). Throws
/// std::invalid_argument for another architecture or a layer out of range.
std::vector<hf_parameter> hf_parameters(const gpt_config& c, int layer);

/// config.json of the model as Hugging Face's GPT2Config writes it (model_type "gpt2", sizes,
/// layer_norm_epsilon 1e-5, tie_word_embeddings, activation_function "gelu_new", ...), indented.
std::string hf_config_json(const gpt_config& c);

/// The model a config.json describes (architecture gpt2; dropout from resid_pdrop; seed and init
/// defaulted). Throws std::invalid_argument naming the file and the key when it is not a GPT-2
/// this runtime builds exactly (another activation, n_inner other than 4 * n_embd, another
/// layer_norm_epsilon, ...) or cannot be read.
gpt_config config_from_hf(const std::string& config_json_path);

/// Checks DIR/config.json against the job's model: throws std::invalid_argument
/// "config.json n_embd 768 disagrees with [model] d_model 64" for the first key that differs.
void check_hf_config(const gpt_config& job_model, const std::string& dir);

/// Checks DIR/model.safetensors (its header only: the file is mapped, not read) against the model:
/// every tensor the layers need is there, of its Hugging Face shape, in a dtype read as weights
/// (F32, F16, BF16). Throws std::invalid_argument naming the file and the first tensor that is
/// missing or wrong, or what makes the file invalid.
void check_hf_weights(const gpt_config& model, const std::string& dir);

}  // namespace oobleck::runtime
