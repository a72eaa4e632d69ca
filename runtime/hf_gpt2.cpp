#include "runtime/hf_gpt2.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "runtime/safetensors.hpp"

namespace oobleck::runtime {

namespace {

using json = nlohmann::json;

/// Our LayerNorms' epsilon (runtime/gpt_model.cpp), GPT-2's.
constexpr double kEpsilon = 1e-5;


}  // namespace

std::vector<hf_parameter> hf_parameters(const gpt_config& c, int layer) {
  if (c.architecture != model_architecture::gpt2)
    throw std::invalid_argument("Hugging Face GPT-2 names exist only for architecture gpt2, not " +
                                architecture_name(c.architecture));
  if (layer < 0 || layer >= c.num_layers())
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not one of the model's " +
                                std::to_string(c.num_layers()) + " layers");
  const std::int64_t d = c.d_model, v = c.vocab;
  if (layer == 0) return {{"transformer.wte.weight", {v, d}}, {"transformer.wpe.weight", {c.seq_len, d}}};
  if (layer == c.num_layers() - 1) {
    std::vector<hf_parameter> head;
    if (tied(c)) head.push_back({"transformer.wte.weight", {v, d}});
    head.push_back({"transformer.ln_f.weight", {d}});
    head.push_back({"transformer.ln_f.bias", {d}});
    if (!tied(c)) head.push_back({"lm_head.weight", {v, d}});
    return head;
  }
  const std::string h = "transformer.h." + std::to_string(layer - 1) + ".";
  return {{h + "ln_1.weight", {d}},
          {h + "ln_1.bias", {d}},
          {h + "attn.c_attn.weight", {3 * d, d}, true},
          {h + "attn.c_attn.bias", {3 * d}},
          {h + "attn.c_proj.weight", {d, d}, true},
          {h + "attn.c_proj.bias", {d}},
          {h + "ln_2.weight", {d}},
          {h + "ln_2.bias", {d}},
          {h + "mlp.c_fc.weight", {4 * d, d}, true},
          {h + "mlp.c_fc.bias", {4 * d}},
          {h + "mlp.c_proj.weight", {d, 4 * d}, true},
          {h + "mlp.c_proj.bias", {d}}};
}

std::string hf_config_json(const gpt_config& c) {
  // The keys GPT2Config.to_json_string writes that decide the model; the dropouts are ours.
  const json j = {{"model_type", "gpt2"},
                  {"architectures", {"GPT2LMHeadModel"}},
                  {"vocab_size", c.vocab},
                  {"n_positions", c.seq_len},
                  {"n_ctx", c.seq_len},
                  {"n_embd", c.d_model},
                  {"n_layer", c.blocks},
                  {"n_head", c.heads},
                  {"n_inner", nullptr},
                  {"activation_function", "gelu_new"},
                  {"layer_norm_epsilon", kEpsilon},
                  {"resid_pdrop", c.dropout},
                  {"embd_pdrop", c.dropout},
                  {"attn_pdrop", c.dropout},
                  {"initializer_range", 0.02},
                  {"scale_attn_weights", true},
                  {"tie_word_embeddings", tied(c)},
                  {"bos_token_id", c.vocab - 1},
                  {"eos_token_id", c.vocab - 1},
                  {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot read the file");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::invalid_argument(path + ": not valid JSON: " + e.what());
  }
}

/// The sizes and tie of a config.json, checked for what this runtime builds exactly.
struct hf_model {
  std::int64_t vocab_size = 0, n_positions = 0, n_embd = 0, n_layer = 0, n_head = 0;
  double epsilon = kEpsilon;
  bool tie = true;
  double dropout = 0.1;
};

hf_model read_hf_model(const std::string& path) {
  const json j = read_json(path);
  auto fail = [&](const std::string& what) -> void { throw std::invalid_argument(path + ": " + what); };
  if (!j.is_object()) fail("not a JSON object");
  if (!j.contains("model_type") || j["model_type"] != "gpt2")
    fail("model_type " + (j.contains("model_type") ? j["model_type"].dump() : std::string("missing")) +
         ": only \"gpt2\" is read");
  hf_model m;
  auto integer = [&](const char* key) -> std::int64_t {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<std::int64_t>() < 1)
      fail(std::string(key) + " missing or not a positive integer");
    return it->get<std::int64_t>();
  };
  m.vocab_size = integer("vocab_size");
  m.n_positions = integer("n_positions");
  m.n_embd = integer("n_embd");
  m.n_layer = integer("n_layer");
  m.n_head = integer("n_head");
  if (const auto it = j.find("layer_norm_epsilon"); it != j.end()) {
    if (!it->is_number()) fail("layer_norm_epsilon is not a number");
    m.epsilon = it->get<double>();
  }
  if (const auto it = j.find("tie_word_embeddings"); it != j.end()) {
    if (!it->is_boolean()) fail("tie_word_embeddings is not true or false");
    m.tie = it->get<bool>();
  }
  if (const auto it = j.find("activation_function"); it != j.end() && *it != "gelu_new")
    fail("activation_function " + it->dump() + ": only \"gelu_new\" (GELU, tanh approximation) is built");
  if (const auto it = j.find("n_inner"); it != j.end() && !it->is_null() && *it != 4 * m.n_embd)
    fail("n_inner " + it->dump() + ": only 4 * n_embd (" + std::to_string(4 * m.n_embd) + ", or null) is built");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (const auto it = j.find(key); it != j.end() && *it == true) fail(std::string(key) + " = true is not built");
  if (const auto it = j.find("scale_attn_weights"); it != j.end() && *it == false)
    fail("scale_attn_weights = false is not built");
  if (const auto it = j.find("resid_pdrop"); it != j.end() && it->is_number()) m.dropout = it->get<double>();
  return m;
}

}  // namespace

gpt_config config_from_hf(const std::string& config_json_path) {
  const hf_model m = read_hf_model(config_json_path);
  if (std::abs(m.epsilon - kEpsilon) > 1e-12)
    throw std::invalid_argument(config_json_path + ": layer_norm_epsilon " + std::to_string(m.epsilon) +
                                ": only 1e-05 is built");
  gpt_config c;
  c.architecture = model_architecture::gpt2;
  c.vocab = m.vocab_size;
  c.seq_len = m.n_positions;
  c.d_model = m.n_embd;
  c.blocks = m.n_layer;
  c.heads = m.n_head;
  c.tie_embeddings = m.tie;
  c.dropout = m.dropout;
  try {
    validate(c);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(config_json_path + ": " + e.what());
  }
  return c;
}

void check_hf_config(const gpt_config& job, const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (job.architecture != model_architecture::gpt2)
    throw std::invalid_argument("needs [model] architecture = \"gpt2\" (the folder holds Hugging Face GPT-2 weights), not \"" +
                                architecture_name(job.architecture) + "\"");
  const hf_model m = read_hf_model(path);
  auto compare = [&](const char* hf_key, std::int64_t theirs, const char* our_key, std::int64_t ours) {
    if (theirs != ours)
      throw std::invalid_argument("config.json " + std::string(hf_key) + " " + std::to_string(theirs) +
                                  " disagrees with [model] " + our_key + " " + std::to_string(ours));
  };
  compare("vocab_size", m.vocab_size, "vocab", job.vocab);
  compare("n_positions", m.n_positions, "seq_len", job.seq_len);
  compare("n_embd", m.n_embd, "d_model", job.d_model);
  compare("n_layer", m.n_layer, "blocks", job.blocks);
  compare("n_head", m.n_head, "heads", job.heads);
  if (std::abs(m.epsilon - kEpsilon) > 1e-12) {
    std::ostringstream s;
    s << "config.json layer_norm_epsilon " << m.epsilon << " disagrees with the model's LayerNorm epsilon 1e-05";
    throw std::invalid_argument(s.str());
  }
  if (m.tie != tied(job))
    throw std::invalid_argument(std::string("config.json tie_word_embeddings ") + (m.tie ? "true" : "false") +
                                " disagrees with [model] tie_embeddings " + (tied(job) ? "true" : "false"));
}

void check_hf_weights(const gpt_config& model, const std::string& dir) {
  const std::string path = dir + "/model.safetensors";
  safetensors_file file;
  try {
    file = safetensors_file::read(path);
  } catch (const safetensors_error& e) {
    throw std::invalid_argument(e.what());
  }
  auto text = [](const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  };
  for (int l = 0; l < model.num_layers(); ++l)
    for (const auto& p : hf_parameters(model, l)) {
      const auto* e = file.find(p.name);
      if (!e) throw std::invalid_argument(path + ": no tensor " + p.name);
      auto shape = p.shape;
      if (p.transposed) std::swap(shape[0], shape[1]);
      if (e->shape != shape)
        throw std::invalid_argument(path + ": tensor " + p.name + " has shape " + text(e->shape) + ", the model needs " +
                                    text(shape));
      if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16")
        throw std::invalid_argument(path + ": tensor " + p.name + " has dtype " + e->dtype +
                                    "; only F32, F16 and BF16 are read as weights");
    }
}

}  // namespace oobleck::runtime
