// The model on a GPU (label cuda; built with OOBLECK_WITH_CUDA=ON, run by scripts/gpu/test.sh; without
// a GPU build only compiled): dropout masks drawn on the device from the seeded generator (issue 28
// item 5), a GPT-2 model whose layers on the GPU compute what they compute on the CPU, and bf16 autocast.
// Without a visible GPU each case says SKIPPED (CTest counts it as skipped, not passed).
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>

#include "runtime/cuda_info.hpp"
#include "runtime/gpt_config.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/layer_store.hpp"
#include "runtime/profiler.hpp"

using namespace oobleck;
using runtime::gpt_config;

namespace {

bool have_gpu() {
  if (torch::cuda::is_available() && torch::cuda::device_count() > 0) return true;
  MESSAGE("SKIPPED: needs a GPU (none visible)");
  return false;
}

gpt_config small_gpt2(double dropout) {
  gpt_config c;
  c.architecture = runtime::model_architecture::gpt2;
  c.vocab = 97;
  c.d_model = 64;
  c.heads = 4;
  c.blocks = 2;
  c.seq_len = 32;
  c.dropout = dropout;
  c.seed = 5;
  return c;
}

const torch::Device gpu(torch::kCUDA, 0);

/// A mask of `n` entries as dropout draws it (keep with probability 1 - p) from a fresh generator.
torch::Tensor mask(const gpt_config& c, std::int64_t step, std::int64_t microbatch, int layer, std::int64_t n) {
  auto g = runtime::dropout_generator(c, step, microbatch, layer, gpu);
  return torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat32).device(g.device())).bernoulli_(1 - c.dropout, g);
}

/// Forward of every layer (in the config's precision), then the loss's backward; returns the loss
/// and the first block's parameter gradients, on the CPU.
std::pair<double, std::vector<torch::Tensor>> step(const gpt_config& c, torch::Device device, bool train,
                                                   const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto layers = runtime::build_layers(c, 0, c.num_layers(), device);
  torch::Tensor x = tokens.to(device), loss;
  {
    const runtime::autocast_scope precision(c.precision, device);
    for (int l = 0; l < c.num_layers(); ++l) {
      layers[l]->train(train);
      auto g = runtime::dropout_generator(c, 3, 1, l, device);
      x = layers[l]->forward(x, &g);
    }
    loss = runtime::lm_loss(x, targets.to(device));
  }
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : layers[1]->parameters()) grads.push_back(p.grad().cpu());
  return {loss.item<double>(), grads};
}

}  // namespace

TEST_CASE("cuda: dropout masks are drawn on the GPU, a pure function of (seed, step, microbatch, layer)") {
  if (!have_gpu()) return;
  const auto c = small_gpt2(0.25);
  CHECK(runtime::dropout_generator(c, 0, 0, 0, gpu).device().is_cuda());
  const std::int64_t n = 1 << 20;
  const auto a = mask(c, 7, 2, 1, n);
  CHECK(a.is_cuda());
  CHECK(torch::equal(a, mask(c, 7, 2, 1, n)));  // a fresh generator of the same triple: the same bits
  CHECK_FALSE(torch::equal(a, mask(c, 7, 2, 2, n)));
  CHECK_FALSE(torch::equal(a, mask(c, 7, 3, 1, n)));
  CHECK_FALSE(torch::equal(a, mask(c, 8, 2, 1, n)));
  const double kept = a.mean().item<double>();
  CAPTURE(kept);
  CHECK(std::abs(kept - 0.75) < 0.005);
  // LibTorch's global generator is neither used nor moved.
  auto global = at::globalContext().defaultGenerator(gpu);
  const auto before = global.current_seed();
  (void)mask(c, 1, 1, 1, n);
  CHECK(global.current_seed() == before);
}

TEST_CASE("cuda: GPT-2 layers on the GPU compute the CPU's loss and gradients without dropout") {
  if (!have_gpu()) return;
  const auto c = small_gpt2(0.0);
  const auto tokens = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto targets = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto [cpu_loss, cpu_grads] = step(c, torch::kCPU, true, tokens, targets);
  const auto [gpu_loss, gpu_grads] = step(c, gpu, true, tokens, targets);
  CAPTURE(cpu_loss);
  CAPTURE(gpu_loss);
  CHECK(std::abs(cpu_loss - gpu_loss) <= 1e-5 * std::abs(cpu_loss));
  REQUIRE(cpu_grads.size() == gpu_grads.size());
  for (std::size_t i = 0; i < cpu_grads.size(); ++i) {
    const double scale = std::max(1e-6, cpu_grads[i].abs().max().item<double>());
    const double diff = (cpu_grads[i] - gpu_grads[i]).abs().max().item<double>() / scale;
    CAPTURE(i);
    CHECK(diff <= 1e-4);
  }
}

TEST_CASE("cuda: a training step with dropout repeats bitwise on the GPU, and dropout changes it") {
  if (!have_gpu()) return;
  const auto c = small_gpt2(0.1);
  const auto tokens = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto targets = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto first = step(c, gpu, true, tokens, targets);
  const auto again = step(c, gpu, true, tokens, targets);
  CHECK(first.first == again.first);
  const auto eval = step(c, gpu, false, tokens, targets);
  CHECK(first.first != eval.first);
}

TEST_CASE("cuda: bf16 autocast on the GPU: near the fp32 loss, fp32 gradients") {
  if (!have_gpu()) return;
  auto c = small_gpt2(0.0);
  const auto tokens = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto targets = torch::randint(0, c.vocab, {4, c.seq_len}, torch::kInt64);
  const auto fp32 = step(c, gpu, true, tokens, targets);
  c.precision = runtime::precision_kind::bf16;
  const auto bf16 = step(c, gpu, true, tokens, targets);
  CAPTURE(fp32.first);
  CAPTURE(bf16.first);
  CHECK(bf16.first != fp32.first);
  CHECK(std::abs(bf16.first - fp32.first) <= 0.02 * fp32.first);
  for (const auto& g : bf16.second) CHECK((g.scalar_type() == torch::kFloat32));
  {
    const runtime::autocast_scope scope(runtime::precision_kind::bf16, gpu);
    CHECK((torch::matmul(torch::randn({4, 8}, gpu), torch::randn({8, 3}, gpu)).scalar_type() == torch::kBFloat16));
  }
  CHECK((torch::matmul(torch::randn({4, 8}, gpu), torch::randn({8, 3}, gpu)).scalar_type() == torch::kFloat32));
}

TEST_CASE("cuda: a GPU profile names the GPU, records at most its memory, and its precision") {
  if (!have_gpu()) return;
  auto c = small_gpt2(0.1);
  runtime::profiler_options options{.microbatch = 2, .warmup = 1, .repeats = 2};
  options.device = runtime::device_spec{"cuda", 0};
  options.device_memory_bytes = std::int64_t{1} << 60;  // more than any GPU
  const auto p = runtime::make_profile(c, options, runtime::measure_layers(c, options));
  CHECK(p.device_kind == "cuda:" + runtime::cuda_device_name(0));
  CHECK(p.device_memory_bytes == runtime::cuda_device_memory_bytes(0));
  for (const auto& l : p.layers) CHECK(l.forward_ms.front() > 0);
  options.device_memory_bytes = 1 << 30;
  c.precision = runtime::precision_kind::bf16;
  const auto q = runtime::make_profile(c, options, runtime::measure_layers(c, options));
  CHECK(q.device_memory_bytes == (1 << 30));
  CHECK(q.device_kind == "cuda:" + runtime::cuda_device_name(0) + " bf16");
}

TEST_CASE("cuda: a parameter digest is computed on the GPU, the same bits as the same function on the CPU") {
  if (!have_gpu()) return;
  const auto t = torch::randn({(1 << 22) + 3});
  const auto on_gpu = t.to(gpu);
  CHECK(runtime::word_sum_digest(5, on_gpu) == runtime::word_sum_digest(5, t));
  CHECK(runtime::word_sum_digest(5, on_gpu, 1000) == runtime::word_sum_digest(5, t));
  CHECK(runtime::tensor_digest({on_gpu}) == runtime::word_sum_digest(1469598103934665603ULL, t));
  auto changed = on_gpu.clone();
  changed.view(torch::kInt32)[12345].bitwise_xor_(1);
  CHECK(runtime::tensor_digest({changed}) != runtime::tensor_digest({on_gpu}));
}

TEST_CASE("cuda: staging a message through host memory is measured, and a GPU profile's link pays it") {
  if (!have_gpu()) return;
  const double staging = runtime::measure_device_staging({"cuda", 0}, 4 << 20, 5);
  MESSAGE("device to host and back, 4 MiB: " << staging / 1e6 << " GB/s");
  CHECK(staging > 0);
  CHECK(std::isfinite(staging));
}
