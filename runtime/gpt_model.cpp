#include "runtime/gpt_model.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <optional>
#include <stdexcept>

namespace oobleck::runtime {

namespace {

constexpr double kInitStd = 0.02;

/// Generator for layer l: split-independent and thread-safe (no global RNG).
at::Generator layer_generator(const gpt_config& c, int layer) {
  return at::detail::createCPUGenerator(c.seed * 1000003ULL + static_cast<std::uint64_t>(layer) * 7919ULL + 17);
}

/// Inverted dropout as LibTorch's, with the mask drawn from `gen` where `gen` draws: a CPU
/// generator's mask is drawn on the CPU, then moved; a GPU generator's on its GPU, with no host work.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training, at::Generator* gen) {
  if (p == 0 || !training) return x;
  if (gen == nullptr) throw std::logic_error("dropout > 0 in training needs a generator; none was given");
  auto keep = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(gen->device()));
  keep.bernoulli_(1 - p, *gen).div_(1 - p);
  return x * keep.to(x.device(), x.scalar_type());
}

/// Causal multi-head self-attention of both architectures: `qkv` [b, s, 3d] (queries, keys, values
/// side by side) in, the heads' outputs [b, s, d] out, before the output projection; scores scaled
/// by 1/sqrt(d_head), dropout on the attention probabilities.
torch::Tensor causal_attention(const torch::Tensor& qkv_flat, std::int64_t heads, double p, bool training,
                               at::Generator* gen) {
  const auto b = qkv_flat.size(0), s = qkv_flat.size(1), d = qkv_flat.size(2) / 3, dh = d / heads;
  auto qkv = qkv_flat.view({b, s, 3, heads, dh}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];  // [b, heads, s, dh]
#if TORCH_VERSION_MAJOR >= 2
  // On a GPU, LibTorch's fused attention (flash or memory-efficient kernels) computes the same
  // function without materialising the [s, s] scores. Not with dropout in training: its masks
  // come from LibTorch's own generator, not the seeded one every replica shares. The CPU keeps the
  // explicit form below in every build, so CPU results do not depend on the LibTorch version.
  if (qkv_flat.is_cuda() && (p == 0 || !training))
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true).transpose(1, 2).reshape({b, s, d});
#endif
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
  att = torch::softmax(att.masked_fill(causal_mask(s, qkv_flat.device()), -std::numeric_limits<float>::infinity()), -1);
  att = dropout(att, p, training, gen);
  return torch::matmul(att, v).transpose(1, 2).reshape({b, s, d});
}

}  // namespace

torch::Tensor causal_mask(std::int64_t s, torch::Device device) {
  // Every forward of every layer asked for a fresh one (two kernels and an allocation each).
  // Never freed: a static of tensors could outlive the device's runtime at exit.
  static auto* const mutex = new std::mutex;
  static auto* const masks = new std::map<std::tuple<std::int64_t, int, int>, torch::Tensor>;
  const auto key = std::make_tuple(s, static_cast<int>(device.type()), static_cast<int>(device.index()));
  std::lock_guard lock(*mutex);
  auto& mask = (*masks)[key];
  if (!mask.defined()) {
    torch::NoGradGuard no_grad;
    mask = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(device)).triu(1);
  }
  return mask;
}

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A layer's initial values: drawn from its generator, or left uninitialised for a layer whose
/// every value is about to be overwritten (a copy received from another node).
class initialiser {
 public:
  explicit initialiser(std::optional<at::Generator> gen) : gen_(std::move(gen)) {}
  torch::Tensor normal(torch::IntArrayRef shape, double std = kInitStd) {
    auto t = torch::empty(shape, torch::kFloat32);
    if (gen_) t.normal_(0.0, std, *gen_);
    return t;
  }
  torch::Tensor ones(torch::IntArrayRef shape) const { return gen_ ? torch::ones(shape) : torch::empty(shape); }
  torch::Tensor zeros(torch::IntArrayRef shape) const { return gen_ ? torch::zeros(shape) : torch::empty(shape); }

 private:
  std::optional<at::Generator> gen_;
};

class embedding_layer : public model_layer {
 public:
  embedding_layer(const gpt_config& c, initialiser& init) {
    token_ = register_parameter("token", init.normal({c.vocab, c.d_model}));
    position_ = register_parameter("position", init.normal({c.seq_len, c.d_model}));
    dropout_ = c.dropout;
  }
  torch::Tensor forward(const torch::Tensor& tokens, at::Generator* gen) override {
    const auto s = tokens.size(1);
    auto x = token_.index_select(0, tokens.reshape({-1})).view({tokens.size(0), s, -1}) +
             position_.slice(0, 0, s).unsqueeze(0);
    return dropout(x, dropout_, is_training(), gen);
  }

 private:
  torch::Tensor token_, position_;
  double dropout_;
};

class block_layer : public model_layer {
 public:
  block_layer(const gpt_config& c, initialiser& init) : heads_(c.heads), dropout_(c.dropout) {
    const auto d = c.d_model;
    // GPT-2 scales the residual projections by 1/sqrt(2 * blocks).
    const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.blocks));
    ln1_w_ = register_parameter("ln1_w", init.ones({d}));
    ln1_b_ = register_parameter("ln1_b", init.zeros({d}));
    // No q/k/v bias: the key bias gets an identically zero gradient (softmax ignores a constant
    // added to every key), so Adam would only integrate rounding noise into it.
    qkv_w_ = register_parameter("qkv_w", init.normal({3 * d, d}));
    proj_w_ = register_parameter("proj_w", init.normal({d, d}, residual_std));
    proj_b_ = register_parameter("proj_b", init.zeros({d}));
    ln2_w_ = register_parameter("ln2_w", init.ones({d}));
    ln2_b_ = register_parameter("ln2_b", init.zeros({d}));
    fc_w_ = register_parameter("fc_w", init.normal({4 * d, d}));
    fc_b_ = register_parameter("fc_b", init.zeros({4 * d}));
    out_w_ = register_parameter("out_w", init.normal({d, 4 * d}, residual_std));
    out_b_ = register_parameter("out_b", init.zeros({d}));
  }

  torch::Tensor forward(const torch::Tensor& x, at::Generator* gen) override {
    const auto d = x.size(2);
    auto h = torch::layer_norm(x, {d}, ln1_w_, ln1_b_);
    auto y = causal_attention(torch::linear(h, qkv_w_), heads_, dropout_, is_training(), gen);
    auto x1 = x + dropout(torch::linear(y, proj_w_, proj_b_), dropout_, is_training(), gen);
    auto h2 = torch::layer_norm(x1, {d}, ln2_w_, ln2_b_);
    auto m = torch::linear(torch::gelu(torch::linear(h2, fc_w_, fc_b_)), out_w_, out_b_);
    return x1 + dropout(m, dropout_, is_training(), gen);
  }

 private:
  std::int64_t heads_;
  double dropout_;
  torch::Tensor ln1_w_, ln1_b_, qkv_w_, proj_w_, proj_b_, ln2_w_, ln2_b_, fc_w_, fc_b_, out_w_, out_b_;
};

class head_layer : public model_layer {
 public:
  head_layer(const gpt_config& c, initialiser& init) {
    ln_w_ = register_parameter("ln_w", init.ones({c.d_model}));
    ln_b_ = register_parameter("ln_b", init.zeros({c.d_model}));
    lm_w_ = register_parameter("lm_w", init.normal({c.vocab, c.d_model}));
  }
  torch::Tensor forward(const torch::Tensor& x, at::Generator*) override {
    return torch::linear(torch::layer_norm(x, {x.size(-1)}, ln_w_, ln_b_), lm_w_);
  }

 private:
  torch::Tensor ln_w_, ln_b_, lm_w_;
};

// GPT-2 as published (Radford et al. 2019; Hugging Face's GPT2LMHeadModel): learned positions,
// pre-LayerNorm blocks with biases everywhere, GELU with the tanh approximation, and an LM head
// that may be tied to the token embedding. Parameters are registered in Hugging Face's order
// (weights in torch.nn.Linear's [out, in] layout, the transpose of its Conv1D), so that the
// safetensors import and export map them by position; layer 0's first parameter is the matrix
// that a tied head holds too.

constexpr double kGpt2LayerNormEps = 1e-5;

class gpt2_embedding_layer : public model_layer {
 public:
  gpt2_embedding_layer(const gpt_config& c, initialiser& init) : dropout_(c.dropout) {
    wte_ = register_parameter("wte", init.normal({c.vocab, c.d_model}));
    wpe_ = register_parameter("wpe", init.normal({c.seq_len, c.d_model}));
  }
  torch::Tensor forward(const torch::Tensor& tokens, at::Generator* gen) override {
    const auto s = tokens.size(1);
    auto x = wte_.index_select(0, tokens.reshape({-1})).view({tokens.size(0), s, -1}) +
             wpe_.slice(0, 0, s).unsqueeze(0);
    return dropout(x, dropout_, is_training(), gen);
  }

 private:
  double dropout_;
  torch::Tensor wte_, wpe_;
};

class gpt2_block_layer : public model_layer {
 public:
  gpt2_block_layer(const gpt_config& c, initialiser& init) : heads_(c.heads), dropout_(c.dropout) {
    const auto d = c.d_model;
    const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.blocks));
    ln1_w_ = register_parameter("ln_1_weight", init.ones({d}));
    ln1_b_ = register_parameter("ln_1_bias", init.zeros({d}));
    attn_w_ = register_parameter("attn_c_attn_weight", init.normal({3 * d, d}));
    attn_b_ = register_parameter("attn_c_attn_bias", init.zeros({3 * d}));
    attn_proj_w_ = register_parameter("attn_c_proj_weight", init.normal({d, d}, residual_std));
    attn_proj_b_ = register_parameter("attn_c_proj_bias", init.zeros({d}));
    ln2_w_ = register_parameter("ln_2_weight", init.ones({d}));
    ln2_b_ = register_parameter("ln_2_bias", init.zeros({d}));
    fc_w_ = register_parameter("mlp_c_fc_weight", init.normal({4 * d, d}));
    fc_b_ = register_parameter("mlp_c_fc_bias", init.zeros({4 * d}));
    mlp_proj_w_ = register_parameter("mlp_c_proj_weight", init.normal({d, 4 * d}, residual_std));
    mlp_proj_b_ = register_parameter("mlp_c_proj_bias", init.zeros({d}));
  }

  torch::Tensor forward(const torch::Tensor& x, at::Generator* gen) override {
    const auto d = x.size(2);
    auto h = torch::layer_norm(x, {d}, ln1_w_, ln1_b_, kGpt2LayerNormEps);
    auto y = causal_attention(torch::linear(h, attn_w_, attn_b_), heads_, dropout_, is_training(), gen);
    auto x1 = x + dropout(torch::linear(y, attn_proj_w_, attn_proj_b_), dropout_, is_training(), gen);
    auto h2 = torch::layer_norm(x1, {d}, ln2_w_, ln2_b_, kGpt2LayerNormEps);
    auto m = torch::linear(torch::gelu(torch::linear(h2, fc_w_, fc_b_), "tanh"), mlp_proj_w_, mlp_proj_b_);
    return x1 + dropout(m, dropout_, is_training(), gen);
  }

 private:
  std::int64_t heads_;
  double dropout_;
  torch::Tensor ln1_w_, ln1_b_, attn_w_, attn_b_, attn_proj_w_, attn_proj_b_, ln2_w_, ln2_b_, fc_w_, fc_b_,
      mlp_proj_w_, mlp_proj_b_;
};

class gpt2_head_layer : public model_layer {
 public:
  /// `embedding_init` draws as layer 0's initialiser does (its generator, fresh): a tied head's
  /// copy of wte starts bitwise equal to layer 0's, wherever the two layers are built.
  gpt2_head_layer(const gpt_config& c, initialiser& init, initialiser& embedding_init) {
    if (tied(c)) lm_w_ = register_parameter("wte", embedding_init.normal({c.vocab, c.d_model}));
    ln_w_ = register_parameter("ln_f_weight", init.ones({c.d_model}));
    ln_b_ = register_parameter("ln_f_bias", init.zeros({c.d_model}));
    if (!tied(c)) lm_w_ = register_parameter("lm_head_weight", init.normal({c.vocab, c.d_model}));
  }
  torch::Tensor forward(const torch::Tensor& x, at::Generator*) override {
    return torch::linear(torch::layer_norm(x, {x.size(-1)}, ln_w_, ln_b_, kGpt2LayerNormEps), lm_w_);
  }

 private:
  torch::Tensor lm_w_, ln_w_, ln_b_;
};

std::shared_ptr<model_layer> build_layer(const gpt_config& c, int l, layer_init how) {
  const bool seeded = how == layer_init::seeded;
  initialiser init(seeded ? std::optional(layer_generator(c, l)) : std::nullopt);
  const bool head = l == c.num_layers() - 1;
  if (c.architecture == model_architecture::oobleck_gpt) {
    if (l == 0) return std::make_shared<embedding_layer>(c, init);
    if (head) return std::make_shared<head_layer>(c, init);
    return std::make_shared<block_layer>(c, init);
  }
  if (l == 0) return std::make_shared<gpt2_embedding_layer>(c, init);
  if (head) {
    initialiser embedding_init(seeded && tied(c) ? std::optional(layer_generator(c, 0)) : std::nullopt);
    return std::make_shared<gpt2_head_layer>(c, init, embedding_init);
  }
  return std::make_shared<gpt2_block_layer>(c, init);
}

}  // namespace

std::vector<std::shared_ptr<model_layer>> build_layers(const gpt_config& c, int first, int end, torch::Device device,
                                                       layer_init how) {
  validate(c);
  if (first < 0 || end > c.num_layers() || first >= end)
    throw std::invalid_argument("layer range [" + std::to_string(first) + ", " + std::to_string(end) +
                                ") is not inside the model's " + std::to_string(c.num_layers()) + " layers");
  std::vector<std::shared_ptr<model_layer>> layers;
  for (int l = first; l < end; ++l) {
    auto layer = build_layer(c, l, how);
    layer->to(device);
    layers.push_back(std::move(layer));
  }
  return layers;
}

at::Generator dropout_generator(const gpt_config& c, std::int64_t step, std::int64_t microbatch, int layer,
                                torch::Device device) {
  // Chained so that no two (step, microbatch, layer) triples of a job share a seed by arithmetic
  // coincidence; the domain constant keeps these apart from the initialisation generators.
  std::uint64_t h = splitmix64(c.seed ^ 0x64726f706f7574ULL);  // "dropout"
  h = splitmix64(h ^ static_cast<std::uint64_t>(step));
  h = splitmix64(h ^ static_cast<std::uint64_t>(microbatch));
  h = splitmix64(h ^ static_cast<std::uint64_t>(layer));
  if (device.is_cpu()) return at::detail::createCPUGenerator(h);
  // A fresh generator of the device's own kind: a clone of its default one (never drawn from
  // here), seeded anew (which also rewinds the Philox offset).
  at::Generator of_device = at::globalContext().defaultGenerator(device);
  at::Generator g;
  {
    std::lock_guard lock(of_device.mutex());
    g = of_device.clone();
  }
  std::lock_guard lock(g.mutex());
  g.set_current_seed(h);
  return g;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // In fp32 whatever the head's precision (a no-op for fp32 logits): bf16 logits would round the loss.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

namespace {

// LibTorch 2.4 keyed autocast's state by device type; 1.13 has a function per device.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
void set_autocast_enabled(c10::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
at::ScalarType autocast_dtype(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
void set_autocast_dtype(c10::DeviceType t, at::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
bool autocast_enabled(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_autocast_enabled(c10::DeviceType t, bool on) {
  if (t == c10::DeviceType::CUDA) at::autocast::set_enabled(on);
  else at::autocast::set_cpu_enabled(on);
}
at::ScalarType autocast_dtype(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast_dtype(c10::DeviceType t, at::ScalarType d) {
  if (t == c10::DeviceType::CUDA) at::autocast::set_autocast_gpu_dtype(d);
  else at::autocast::set_autocast_cpu_dtype(d);
}
#endif

}  // namespace

autocast_scope::autocast_scope(precision_kind precision, const torch::Device& device) {
  if (precision == precision_kind::fp32) return;
  if (!device.is_cpu() && !device.is_cuda())
    throw std::invalid_argument("bf16 autocast runs on the CPU or a CUDA GPU, not on " + device.str());
  active_ = true;
  type_ = device.type();
  was_enabled_ = autocast_enabled(type_);
  was_dtype_ = autocast_dtype(type_);
  set_autocast_dtype(type_, at::kBFloat16);
  set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
}

autocast_scope::~autocast_scope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(type_, was_enabled_);
  set_autocast_dtype(type_, was_dtype_);
}

}  // namespace oobleck::runtime
