// GPT-2 (issue 24): our layers against a reference built from LibTorch's own modules
// (torch::nn::Embedding, LayerNorm, Linear, gelu with the tanh approximation), with every weight
// copied from ours; the tied head's copy of the token embedding; the parameter order the
// safetensors mapping relies on; the synthetic profile's and the profiler's view of the model.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "planning/synthetic_profile.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/layer_store.hpp"
#include "runtime/profiler.hpp"

using namespace oobleck;
using runtime::gpt_config;
using runtime::model_architecture;
namespace F = torch::nn::functional;

namespace {

gpt_config tiny_gpt2(bool tie, double dropout = 0.0) {
  gpt_config c;
  c.architecture = model_architecture::gpt2;
  c.vocab = 61;
  c.d_model = 32;
  c.heads = 4;
  c.blocks = 2;
  c.seq_len = 12;
  c.dropout = dropout;
  c.seed = 99;
  c.tie_embeddings = tie;
  return c;
}

using layers_t = std::vector<std::shared_ptr<runtime::model_layer>>;

std::vector<std::pair<std::string, std::vector<std::int64_t>>> names_and_shapes(const runtime::model_layer& layer) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  for (const auto& p : layer.named_parameters()) out.emplace_back(p.key(), p.value().sizes().vec());
  return out;
}

/// Every parameter drawn afresh so that biases and LayerNorm affines are not 0 and 1 (a bias that
/// is never added would go unnoticed at its initial 0); a tied head keeps layer 0's matrix.
void randomise(const layers_t& layers, const gpt_config& c) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(4242);
  for (const auto& layer : layers)
    for (const auto& p : layer->named_parameters()) {
      auto r = torch::empty(p.value().sizes()).normal_(0.0, 0.3, gen);
      if (p.key().find("ln_") != std::string::npos && p.key().find("weight") != std::string::npos) r.add_(1.0);
      p.value().copy_(r);
    }
  if (runtime::tied(c)) layers.back()->parameters()[0].copy_(layers.front()->parameters()[0]);
}

/// The mask LibTorch's dropout would apply, drawn from `gen` as our layers draw theirs.
torch::Tensor dropout_mask(torch::IntArrayRef shape, double p, at::Generator& gen) {
  return torch::empty(shape).bernoulli_(1 - p, gen).div_(1 - p);
}

/// GPT-2 from LibTorch's modules, weights copied from our layers by position.
struct reference_gpt2 {
  struct block {
    torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
    torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};
  };
  gpt_config c;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};

  reference_gpt2(const gpt_config& config, const layers_t& ours) : c(config) {
    const auto d = c.d_model;
    torch::NoGradGuard no_grad;
    auto set = [](torch::Tensor& to, const torch::Tensor& from) {
      REQUIRE(to.sizes() == from.sizes());
      to.copy_(from);
    };
    auto norm = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(1e-5)); };
    auto linear = [](std::int64_t in, std::int64_t out, bool bias) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
    };
    const auto p0 = ours.front()->parameters();
    wte = torch::nn::Embedding(c.vocab, d);
    wpe = torch::nn::Embedding(c.seq_len, d);
    set(wte->weight, p0[0]);
    set(wpe->weight, p0[1]);
    for (int l = 1; l <= c.blocks; ++l) {
      const auto p = ours[l]->parameters();
      REQUIRE(p.size() == 12);
      block b{norm(), norm(), linear(d, 3 * d, true), linear(d, d, true), linear(d, 4 * d, true), linear(4 * d, d, true)};
      set(b.ln_1->weight, p[0]);
      set(b.ln_1->bias, p[1]);
      set(b.c_attn->weight, p[2]);
      set(b.c_attn->bias, p[3]);
      set(b.attn_proj->weight, p[4]);
      set(b.attn_proj->bias, p[5]);
      set(b.ln_2->weight, p[6]);
      set(b.ln_2->bias, p[7]);
      set(b.c_fc->weight, p[8]);
      set(b.c_fc->bias, p[9]);
      set(b.mlp_proj->weight, p[10]);
      set(b.mlp_proj->bias, p[11]);
      blocks.push_back(std::move(b));
    }
    const auto ph = ours.back()->parameters();
    ln_f = norm();
    if (runtime::tied(c)) {
      REQUIRE(ph.size() == 3);
      REQUIRE(torch::equal(ph[0], p0[0]));  // one matrix: the reference holds it once
      set(ln_f->weight, ph[1]);
      set(ln_f->bias, ph[2]);
    } else {
      REQUIRE(ph.size() == 3);
      set(ln_f->weight, ph[0]);
      set(ln_f->bias, ph[1]);
      lm_head = linear(d, c.vocab, false);
      set(lm_head->weight, ph[2]);
    }
  }

  /// With `train`, dropout masks come from dropout_generator(c, 0, 0, layer) in the order the
  /// specification gives: embedding sum; per block attention probabilities, attention output,
  /// MLP output.
  torch::Tensor forward(const torch::Tensor& tokens, bool train) {
    const auto b = tokens.size(0), s = tokens.size(1), d = c.d_model, dh = d / c.heads;
    auto drop = [&](const torch::Tensor& x, at::Generator& gen) {
      return train && c.dropout > 0 ? x * dropout_mask(x.sizes(), c.dropout, gen) : x;
    };
    auto gen0 = runtime::dropout_generator(c, 0, 0, 0);
    auto x = drop(wte(tokens) + wpe(torch::arange(s, torch::kInt64)), gen0);
    const auto allowed = torch::tril(torch::ones({s, s}, torch::kBool));
    for (int l = 0; l < c.blocks; ++l) {
      auto gen = runtime::dropout_generator(c, 0, 0, l + 1);
      auto& blk = blocks[l];
      auto qkv = blk.c_attn(blk.ln_1(x)).split(d, -1);
      auto heads = [&](const torch::Tensor& t) { return t.view({b, s, c.heads, dh}).transpose(1, 2); };
      auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
      auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
      att = F::softmax(att.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity()),
                       F::SoftmaxFuncOptions(-1));
      att = drop(att, gen);
      auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, s, d});
      x = x + drop(blk.attn_proj(y), gen);
      auto m = blk.mlp_proj(F::gelu(blk.c_fc(blk.ln_2(x)), F::GELUFuncOptions().approximate("tanh")));
      x = x + drop(m, gen);
    }
    auto h = ln_f(x);
    return runtime::tied(c) ? F::linear(h, wte->weight) : lm_head(h);
  }
};

/// Largest absolute difference, relative to the reference's largest entry when that is above 1.
double difference(const torch::Tensor& ours, const torch::Tensor& reference) {
  REQUIRE(ours.sizes() == reference.sizes());
  const double scale = std::max(1.0, reference.abs().max().item<double>());
  return (ours - reference).abs().max().item<double>() / scale;
}

struct batch {
  torch::Tensor tokens, targets;
};

batch make_batch(const gpt_config& c, std::int64_t b) {
  auto gen = at::detail::createCPUGenerator(77);
  return {torch::randint(0, c.vocab, {b, c.seq_len}, gen, torch::kInt64),
          torch::randint(0, c.vocab, {b, c.seq_len}, gen, torch::kInt64)};
}

/// Forward and backward of our layers and of the reference on the same batch; every comparison
/// within 1e-5.
void check_against_reference(const gpt_config& c, bool train) {
  const int L = c.num_layers();
  auto ours = runtime::build_layers(c, 0, L);
  randomise(ours, c);
  reference_gpt2 ref(c, ours);
  for (const auto& layer : ours) layer->train(train);
  const auto data = make_batch(c, 3);

  torch::Tensor x = data.tokens;
  for (int l = 0; l < L; ++l) {
    auto gen = runtime::dropout_generator(c, 0, 0, l);
    x = ours[l]->forward(x, &gen);
  }
  const auto logits = x;
  const auto loss = runtime::lm_loss(logits, data.targets);
  loss.backward();

  const auto ref_logits = ref.forward(data.tokens, train);
  const auto ref_loss = F::cross_entropy(ref_logits.reshape({-1, c.vocab}), data.targets.reshape({-1}));
  ref_loss.backward();

  CHECK(difference(logits, ref_logits) <= 1e-5);
  CHECK(std::abs(loss.item<double>() - ref_loss.item<double>()) <= 1e-5 * std::max(1.0, ref_loss.item<double>()));
  // The loss is far from log(vocab): the weights are not at an initialisation where any model fits.
  CHECK(std::abs(ref_loss.item<double>() - std::log(static_cast<double>(c.vocab))) > 0.1);

  const auto p0 = ours.front()->parameters();
  const auto ph = ours.back()->parameters();
  if (runtime::tied(c)) {
    // The pipeline's embedding group sums the two uses: layer 0's lookup and the head's projection.
    CHECK(difference(p0[0].grad() + ph[0].grad(), ref.wte->weight.grad()) <= 1e-5);
    // Each use alone is not the whole gradient.
    CHECK(difference(p0[0].grad(), ref.wte->weight.grad()) > 1e-3);
    CHECK(difference(ph[1].grad(), ref.ln_f->weight.grad()) <= 1e-5);
    CHECK(difference(ph[2].grad(), ref.ln_f->bias.grad()) <= 1e-5);
  } else {
    CHECK(difference(p0[0].grad(), ref.wte->weight.grad()) <= 1e-5);
    CHECK(difference(ph[0].grad(), ref.ln_f->weight.grad()) <= 1e-5);
    CHECK(difference(ph[1].grad(), ref.ln_f->bias.grad()) <= 1e-5);
    CHECK(difference(ph[2].grad(), ref.lm_head->weight.grad()) <= 1e-5);
  }
  CHECK(difference(p0[1].grad(), ref.wpe->weight.grad()) <= 1e-5);
  for (int l = 1; l <= c.blocks; ++l) {
    CAPTURE(l);
    const auto p = ours[l]->parameters();
    const auto& blk = ref.blocks[l - 1];
    const torch::Tensor expected[] = {blk.ln_1->weight.grad(),    blk.ln_1->bias.grad(),    blk.c_attn->weight.grad(),
                                      blk.c_attn->bias.grad(),    blk.attn_proj->weight.grad(), blk.attn_proj->bias.grad(),
                                      blk.ln_2->weight.grad(),    blk.ln_2->bias.grad(),    blk.c_fc->weight.grad(),
                                      blk.c_fc->bias.grad(),      blk.mlp_proj->weight.grad(), blk.mlp_proj->bias.grad()};
    for (std::size_t i = 0; i < p.size(); ++i) {
      CAPTURE(i);
      REQUIRE(p[i].grad().defined());
      CHECK(difference(p[i].grad(), expected[i]) <= 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("gpt2 layers register Hugging Face's parameters in its order, in torch.nn.Linear layout") {
  using shapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
  for (const bool tie : {true, false}) {
    CAPTURE(tie);
    const auto c = tiny_gpt2(tie);
    const std::int64_t d = c.d_model, V = c.vocab, T = c.seq_len;
    const auto layers = runtime::build_layers(c, 0, c.num_layers());
    REQUIRE(layers.size() == 4);
    CHECK(names_and_shapes(*layers[0]) == shapes{{"wte", {V, d}}, {"wpe", {T, d}}});
    for (int l = 1; l <= c.blocks; ++l)
      CHECK(names_and_shapes(*layers[l]) == shapes{{"ln_1_weight", {d}},
                                                   {"ln_1_bias", {d}},
                                                   {"attn_c_attn_weight", {3 * d, d}},
                                                   {"attn_c_attn_bias", {3 * d}},
                                                   {"attn_c_proj_weight", {d, d}},
                                                   {"attn_c_proj_bias", {d}},
                                                   {"ln_2_weight", {d}},
                                                   {"ln_2_bias", {d}},
                                                   {"mlp_c_fc_weight", {4 * d, d}},
                                                   {"mlp_c_fc_bias", {4 * d}},
                                                   {"mlp_c_proj_weight", {d, 4 * d}},
                                                   {"mlp_c_proj_bias", {d}}});
    if (tie)
      CHECK(names_and_shapes(*layers.back()) == shapes{{"wte", {V, d}}, {"ln_f_weight", {d}}, {"ln_f_bias", {d}}});
    else
      CHECK(names_and_shapes(*layers.back()) ==
            shapes{{"ln_f_weight", {d}}, {"ln_f_bias", {d}}, {"lm_head_weight", {V, d}}});
  }
}

TEST_CASE("gpt2 forward and backward equal LibTorch's modules within 1e-5, tied and untied, with and without dropout") {
  for (const bool tie : {true, false})
    for (const bool train : {false, true}) {
      CAPTURE(tie);
      CAPTURE(train);
      check_against_reference(tiny_gpt2(tie, 0.1), train);
    }
}

TEST_CASE("autocast_scope: bf16 casts this thread's matrix products while it lives, fp32 none") {
  const auto c = tiny_gpt2(false);
  auto layers = runtime::build_layers(c, 0, 2);
  const auto data = make_batch(c, 2);
  const auto a = torch::randn({4, 8}), b = torch::randn({8, 3});
  const auto full = layers[1]->forward(layers[0]->forward(data.tokens));
  torch::Tensor cast;
  {
    const runtime::autocast_scope scope(runtime::precision_kind::bf16, torch::kCPU);
    CHECK((torch::matmul(a, b).scalar_type() == torch::kBFloat16));
    {
      const runtime::autocast_scope inner(runtime::precision_kind::bf16, torch::kCPU);  // nested: still on after it
    }
    CHECK((torch::matmul(a, b).scalar_type() == torch::kBFloat16));
    cast = layers[1]->forward(layers[0]->forward(data.tokens));
  }
  CHECK((torch::matmul(a, b).scalar_type() == torch::kFloat32));  // off again
  CHECK_FALSE(torch::equal(cast.to(torch::kFloat32), full));
  CHECK(torch::allclose(cast.to(torch::kFloat32), full, 0.05, 0.05));
  {
    const runtime::autocast_scope scope(runtime::precision_kind::fp32, torch::kCPU);
    CHECK((torch::matmul(a, b).scalar_type() == torch::kFloat32));
  }
}

TEST_CASE("gpt2 dropout draws its masks in training only, from the given generator") {
  const auto c = tiny_gpt2(true, 0.1);
  auto layers = runtime::build_layers(c, 0, 2);
  const auto data = make_batch(c, 2);
  auto run = [&](std::uint64_t step) {
    auto g0 = runtime::dropout_generator(c, step, 0, 0), g1 = runtime::dropout_generator(c, step, 0, 1);
    return layers[1]->forward(layers[0]->forward(data.tokens, &g0), &g1);
  };
  CHECK(torch::equal(run(0), run(0)));
  CHECK_FALSE(torch::equal(run(0), run(1)));
  for (const auto& l : layers) l->eval();
  CHECK(torch::equal(run(0), run(1)));
  for (const auto& l : layers) l->train();
  CHECK_THROWS_AS(layers[0]->forward(data.tokens, nullptr), std::logic_error);
}

TEST_CASE("the tied head's copy of wte is bitwise layer 0's at initialisation, wherever each is built") {
  const auto c = tiny_gpt2(true);
  const int L = c.num_layers();
  const auto whole = runtime::build_layers(c, 0, L);
  CHECK(torch::equal(whole.front()->parameters()[0], whole.back()->parameters()[0]));
  // The head alone, as a last stage on another node builds it.
  const auto head = runtime::build_layers(c, L - 1, L);
  const auto embedding = runtime::build_layers(c, 0, 1);
  CHECK(torch::equal(head.front()->parameters()[0], embedding.front()->parameters()[0]));
  CHECK(torch::equal(head.front()->parameters()[0], whole.front()->parameters()[0]));
  // GPT-2's initialisation: normal(0, 0.02) for the embeddings.
  const auto wte = whole.front()->parameters()[0];
  CHECK(wte.std().item<double>() == doctest::Approx(0.02).epsilon(0.05));
  // Two matrices, not one tensor: the runtime keeps them equal, not aliasing.
  CHECK(wte.data_ptr() != whole.back()->parameters()[0].data_ptr());
  // Untied, the LM head is a matrix of its own, drawn from the head's generator.
  const auto u = tiny_gpt2(false);
  const auto untied = runtime::build_layers(u, 0, L);
  CHECK_FALSE(torch::equal(untied.back()->parameters()[2], untied.front()->parameters()[0]));
  // Unintialised layers (a copy will overwrite them) have the shapes all the same.
  const auto empty = runtime::build_layers(c, L - 1, L, torch::kCPU, runtime::layer_init::uninitialised);
  CHECK(empty.front()->parameters()[0].sizes() == wte.sizes());
}

TEST_CASE("gpt2 initialisation follows Hugging Face's: residual projections scaled, biases 0, norms 1") {
  auto c = tiny_gpt2(true);
  c.d_model = 128;  // enough draws for the standard deviations to be measured
  c.blocks = 8;
  const auto block = runtime::build_layers(c, 1, 2).front()->named_parameters();
  const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(c.blocks));
  CHECK(block["attn_c_attn_weight"].std().item<double>() == doctest::Approx(0.02).epsilon(0.05));
  CHECK(block["mlp_c_fc_weight"].std().item<double>() == doctest::Approx(0.02).epsilon(0.05));
  CHECK(block["attn_c_proj_weight"].std().item<double>() == doctest::Approx(residual).epsilon(0.05));
  CHECK(block["mlp_c_proj_weight"].std().item<double>() == doctest::Approx(residual).epsilon(0.05));
  for (const char* zero : {"attn_c_attn_bias", "attn_c_proj_bias", "ln_1_bias", "ln_2_bias", "mlp_c_fc_bias",
                           "mlp_c_proj_bias"})
    CHECK(torch::count_nonzero(block[zero]).item<std::int64_t>() == 0);
  CHECK(torch::equal(block["ln_1_weight"], torch::ones({c.d_model})));
  CHECK(torch::equal(block["ln_2_weight"], torch::ones({c.d_model})));
}

TEST_CASE("the synthetic profile counts gpt2's parameters: biases, and the tied wte on the head's stage too") {
  auto c = tiny_gpt2(true);
  const int L = c.num_layers();
  const auto layers = runtime::build_layers(c, 0, L);
  const auto profile = planning::synthetic_gpt_profile({.layers = L,
                                                        .hidden = static_cast<int>(c.d_model),
                                                        .heads = static_cast<int>(c.heads),
                                                        .sequence = static_cast<int>(c.seq_len),
                                                        .vocab = static_cast<int>(c.vocab),
                                                        .microbatch = 1,
                                                        .gpus_per_node = 1});
  REQUIRE(profile.num_layers() == L);
  for (int l = 0; l < L; ++l) {
    CAPTURE(l);
    std::int64_t bytes = 0;
    for (const auto& p : layers[l]->parameters()) bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
    CHECK(profile.layers[l].param_bytes == bytes);
  }
  CHECK(profile.layers.back().param_bytes >= c.vocab * c.d_model * 4);
}

TEST_CASE("the profiler measures gpt2 layers and tags the profile with the gpt2 hash") {
  const auto c = tiny_gpt2(true, 0.1);
  const runtime::profiler_options options{.microbatch = 2, .warmup = 0, .repeats = 2};
  const auto measured = runtime::measure_layers(c, options);
  REQUIRE(measured.size() == static_cast<std::size_t>(c.num_layers()));
  CHECK(measured.back().param_bytes == (c.vocab * c.d_model + 2 * c.d_model) * 4);
  for (const auto& m : measured) {
    CHECK(m.forward_ms > 0);
    CHECK(m.backward_ms > 0);
  }
  const auto profile = runtime::make_profile(c, options, measured);
  CHECK(profile.config_hash == c.hash());
  CHECK(profile.model.rfind("gpt2-", 0) == 0);
}

TEST_CASE("largest_frame_bytes bounds a gpt2 block's copy, biases included, with its margin of two") {
  // d large enough that a block, not the all-reduce segment or the embedding, is the largest frame.
  auto c = tiny_gpt2(true);
  c.vocab = 256;
  c.d_model = 256;
  c.blocks = 1;
  c.seq_len = 16;
  const std::uint64_t bound = runtime::largest_frame_bytes(c, 1);
  runtime::layer_store store(c);
  store.ensure(0, c.num_layers());
  std::uint64_t largest = 0;
  for (int l = 0; l < c.num_layers(); ++l)
    for (const auto& b : store.copy_of(l).buffers) largest = std::max<std::uint64_t>(largest, b.nbytes());
  CHECK(largest > (std::uint64_t{1} << 20));
  CHECK(largest <= bound / 2);
}

TEST_CASE("the causal mask is built once per sequence length and device, and shared by every thread") {
  // Every attention forward used to build its own mask; the stages of a node run on threads of
  // their own, so the one mask per length must be handed out safely from any of them.
  std::vector<const void*> seen(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&seen, i] { seen[i] = runtime::causal_mask(13, torch::kCPU).data_ptr(); });
  for (auto& t : threads) t.join();
  for (const auto* p : seen) CHECK(p == seen[0]);
  const auto mask = runtime::causal_mask(13, torch::kCPU);
  CHECK(mask.data_ptr() == seen[0]);
  CHECK(torch::equal(mask, torch::ones({13, 13}, torch::kBool).triu(1)));
  const auto other = runtime::causal_mask(7, torch::kCPU);
  CHECK(other.sizes() == torch::IntArrayRef{7, 7});
  CHECK(other.data_ptr() != mask.data_ptr());
  // A forward of a layer uses the cached mask: its output is the same with the mask built afresh.
  gpt_config c;
  c.vocab = 32;
  c.d_model = 16;
  c.heads = 2;
  c.blocks = 1;
  c.seq_len = 13;
  auto block = runtime::build_layers(c, 1, 2).front();
  torch::manual_seed(3);
  const auto x = torch::randn({2, 13, 16});
  CHECK(torch::equal(block->forward(x), block->forward(x)));
}
