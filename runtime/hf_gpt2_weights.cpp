#include "runtime/hf_gpt2_weights.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "runtime/hf_gpt2.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::runtime {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void load_hf_layer(const safetensors_file& file, const gpt_config& c, int layer,
                   const std::vector<torch::Tensor>& parameters) {
  const auto names = hf_parameters(c, layer);
  if (names.size() != parameters.size())
    throw std::logic_error("layer " + std::to_string(layer) + " has " + std::to_string(parameters.size()) +
                           " parameters; the Hugging Face mapping names " + std::to_string(names.size()));
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& p = names[i];
    const safetensors_entry* e = file.find(p.name);
    if (!e) throw std::invalid_argument("model.safetensors has no tensor " + p.name + " (layer " + std::to_string(layer) + ")");
    auto hf_shape = p.shape;
    if (p.transposed) std::swap(hf_shape[0], hf_shape[1]);
    if (e->shape != hf_shape)
      throw std::invalid_argument("model.safetensors tensor " + p.name + " has shape " + shape_text(e->shape) +
                                  ", the model needs " + shape_text(hf_shape));
    std::vector<float> values;
    try {
      values = file.floats(*e);
    } catch (const safetensors_error& err) {
      throw std::invalid_argument(err.what());
    }
    auto t = torch::from_blob(values.data(), hf_shape, torch::kFloat32);
    if (p.transposed) t = t.t();
    parameters[i].copy_(t);
  }
}

void load_hf_layer(const std::string& dir, const gpt_config& c, int layer, const std::vector<torch::Tensor>& parameters) {
  const std::string path = (std::filesystem::path(dir) / "model.safetensors").string();
  safetensors_file file;
  try {
    file = safetensors_file::read(path);
  } catch (const safetensors_error& e) {
    throw std::invalid_argument(std::string("model.init: ") + e.what());
  }
  try {
    load_hf_layer(file, c, layer, parameters);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("model.init: " + path + ": " + e.what());
  }
}

void export_hf(const layer_store& store, const std::string& dir) {
  const gpt_config& c = store.model();
  if (c.architecture != model_architecture::gpt2)
    throw std::invalid_argument("only architecture gpt2 has Hugging Face names; this model is " +
                                architecture_name(c.architecture));
  std::vector<torch::Tensor> keep;  // contiguous CPU copies in Hugging Face layout
  std::vector<safetensors_tensor> tensors;
  for (int l = 0; l < c.num_layers(); ++l) {
    const auto names = hf_parameters(c, l);
    const auto params = store.parameters(l);
    for (std::size_t i = 0; i < names.size(); ++i) {
      const bool tied_copy = l == c.num_layers() - 1 && tied(c) && names[i].name == "transformer.wte.weight";
      if (tied_copy) {  // layer 0 wrote the matrix; the runtime keeps both copies bitwise equal
        if (!torch::equal(params[i], store.parameters(0)[0]))
          throw std::runtime_error("the LM head's copy of the tied token embedding differs from layer 0's: the "
                                   "model's two copies diverged, and no single transformer.wte.weight describes it");
        continue;
      }
      auto t = params[i].detach().to(torch::kCPU);
      if (names[i].transposed) t = t.t();
      t = t.contiguous();
      keep.push_back(t);
      std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
      tensors.push_back({names[i].name, shape, {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())}});
    }
  }
  std::filesystem::create_directories(dir);
  write_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  const auto config = (std::filesystem::path(dir) / "config.json").string();
  std::ofstream out(config, std::ios::trunc);
  out << hf_config_json(c);
  if (!out.flush()) throw std::runtime_error(config + ": cannot write the file");
}

}  // namespace oobleck::runtime
