#include "runtime/profiler.hpp"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "runtime/cuda_info.hpp"
#include "runtime/device.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/median.hpp"
#include "runtime/optimizer.hpp"

// LibTorch 2.3 made Allocator::allocate() non-const and, with 2.2's copy_data(), both pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define OOBLECK_TORCH_ALLOCATOR_2_3 1
#endif

namespace oobleck::runtime {

namespace {

/// A GPU queues work and returns: a time is read once the device has finished what came before.
void settle(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// Wraps LibTorch's CPU allocator to count live bytes. LibTorch's raw_allocate() requires the
/// context to be the data pointer, so sizes live in a side table keyed by pointer.
class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* base) : base_(base), base_deleter_(base->raw_deleter()) {}

#ifdef OOBLECK_TORCH_ALLOCATOR_2_3
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    auto inner = base_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    if (!base_deleter_ || inner.get_context() != data) return inner;  // cannot wrap: leave uncounted
    inner.release_context();
    {
      std::lock_guard lock(mutex_);
      sizes_[data] = n;
    }
    live_.fetch_add(static_cast<std::int64_t>(n));
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return base_deleter_ ? &release : nullptr; }
#ifdef OOBLECK_TORCH_ALLOCATOR_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }
#endif

  std::int64_t live() const { return live_.load(); }

 private:
  static void release(void* data);

  c10::Allocator* base_;
  c10::DeleterFnPtr base_deleter_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable std::atomic<std::int64_t> live_{0};
};

counting_allocator* installed = nullptr;

void counting_allocator::release(void* data) {
  size_t n = 0;
  {
    std::lock_guard lock(installed->mutex_);
    auto it = installed->sizes_.find(data);
    if (it != installed->sizes_.end()) {
      n = it->second;
      installed->sizes_.erase(it);
    }
  }
  installed->live_.fetch_sub(static_cast<std::int64_t>(n));
  installed->base_deleter_(data);
}

counting_allocator& allocator() {
  // Installed once, process-wide; tensors allocated earlier keep their own deleters.
  static counting_allocator* instance = [] {
    installed = new counting_allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(installed, /*priority=*/100);
    return installed;
  }();
  return *instance;
}

double ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

/// Per layer, the median of AdamW steps over its parameters on one thread, with gradients of their
/// shape (the step's work does not depend on the values). Each repeat steps every layer in order,
/// as commit() does, so no layer's state is still in the caches from its own last step. Read from
/// the steady clock (options.clock scripts the layer timings only).
std::vector<double> time_optimizer(const std::vector<std::shared_ptr<model_layer>>& layers,
                                   const profiler_options& options, const torch::Device& device) {
  const auto now = [] { return std::chrono::steady_clock::now(); };
  torch::NoGradGuard no_grad;
  torch::set_num_threads(1);
  // The update a commit makes (layer_store::optimizer_step): over the layer's flat buffers at once.
  struct layer_state {
    flat_adamw_buffers buffers;
    element_ranges decayed;
    std::int64_t step = 0;
  };
  std::vector<layer_state> states;
  for (const auto& layer : layers) {
    layer_state s;
    std::vector<torch::Tensor> flat;
    for (const auto& p : layer->parameters()) flat.push_back(p.detach().reshape({-1}));
    s.buffers.parameters = torch::cat(flat);
    s.buffers.gradients = torch::full_like(s.buffers.parameters, 1e-3);
    s.buffers.exp_avg = torch::zeros_like(s.buffers.parameters);
    s.buffers.exp_avg_sq = torch::zeros_like(s.buffers.parameters);
    s.decayed = matrix_ranges(layer->parameters());
    states.push_back(std::move(s));
  }
  std::vector<std::vector<double>> samples(layers.size());
  for (int it = 0; it < options.warmup + options.repeats; ++it)
    for (std::size_t l = 0; l < states.size(); ++l) {
      settle(device);
      const auto start = now();
      flat_adamw_step(states[l].buffers, states[l].decayed, states[l].step, adamw_options{});
      settle(device);
      if (it >= options.warmup) samples[l].push_back(ms_between(start, now()));
    }
  std::vector<double> medians;
  for (const auto& s : samples) medians.push_back(median(s));
  return medians;
}

}  // namespace

std::int64_t live_cpu_bytes() { return allocator().live(); }

std::vector<layer_measurement> measure_layers(const gpt_config& model, const profiler_options& options) {
  if (options.microbatch < 1 || options.repeats < 1 || options.warmup < 0)
    throw std::invalid_argument("profiler: microbatch and repeats must be >= 1, warmup >= 0");
  if (!planning::is_power_of_two(options.slots_per_node) || options.slots_per_node > 64)
    throw std::invalid_argument("profiler: slots_per_node must be a power of two in [1, 64]");
  const torch::Device device = make_device(options.device);
  if (device.is_cuda() && options.slots_per_node != 1)
    throw std::invalid_argument("profiler: a GPU runs one stage per worker: slots_per_node must be 1");
  allocator();
  runtime::use_one_compute_thread();
  const auto now = options.clock ? options.clock : [] { return std::chrono::steady_clock::now(); };
  const auto live_bytes = [device]() -> std::int64_t {
#ifdef OOBLECK_WITH_CUDA
    if (device.is_cuda()) return cuda_allocated_bytes(device.index());
#endif
    return live_cpu_bytes();
  };
  const int L = model.num_layers();
  auto layers = build_layers(model, 0, L, device);
  const std::int64_t b = options.microbatch, s = model.seq_len;
  torch::manual_seed(static_cast<std::uint64_t>(model.seed));
  const auto tokens = torch::randint(0, model.vocab, {b, s}, torch::kInt64).to(device);
  const auto targets = torch::randint(0, model.vocab, {b, s}, torch::kInt64).to(device);
  std::vector<layer_measurement> out(L);
  for (int l = 0; l < L; ++l) {
    auto& m = out[l];
    m.name = l == 0 ? "embedding" : (l == L - 1 ? "head" : "block" + std::to_string(l - 1));
    for (const auto& p : layers[l]->parameters()) m.param_bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  // Every layer is timed where a stage runs it: a microbatch's forward goes through the layers in
  // order, then its backward through them in reverse, each layer's graph cut from the next at its
  // output. Timing one layer over and over instead kept that layer's weights in the caches and
  // measured the larger model 10-20% faster than it trains (bench/RESULTS.md).
  for (const int width : planning::stage_widths(options.slots_per_node)) {
    // A stage of width d runs with d intra-op threads (actors/stage.cpp), so it is timed so.
    torch::set_num_threads(width);
    std::vector<std::vector<double>> forward_samples(L), backward_samples(L);
    for (int it = 0; it < options.warmup + options.repeats; ++it) {
      std::vector<torch::Tensor> inputs(L), outputs(L);
      std::vector<double> fwd(L), bwd(L);
      std::vector<std::int64_t> retained(L);
      for (int l = 0; l < L; ++l) {
        auto dropout = dropout_generator(model, it, 0, l, device);  // as in training: never the global generator
        inputs[l] = l == 0 ? tokens : outputs[l - 1].detach().requires_grad_(true);
        settle(device);
        const auto live_before = live_bytes();
        const auto start = now();
        torch::Tensor y;
        {
          const autocast_scope precision(model.precision, device);
          y = layers[l]->forward(inputs[l], &dropout);
          if (l == L - 1) y = lm_loss(y, targets);
        }
        settle(device);
        fwd[l] = ms_between(start, now());
        retained[l] = live_bytes() - live_before;
        if (l < L - 1) out[l].output_bytes = static_cast<std::int64_t>(y.nbytes());
        outputs[l] = std::move(y);
      }
      for (int l = L - 1; l >= 0; --l) {
        settle(device);
        const auto start = now();
        if (l == L - 1) outputs[l].backward();
        else outputs[l].backward(inputs[l + 1].grad());
        settle(device);
        bwd[l] = ms_between(start, now());
      }
      for (int l = 0; l < L; ++l)
        for (auto& p : layers[l]->parameters()) p.mutable_grad() = torch::Tensor();
      if (it < options.warmup) continue;
      for (int l = 0; l < L; ++l) {
        forward_samples[l].push_back(fwd[l]);
        backward_samples[l].push_back(bwd[l]);
        out[l].activation_bytes = std::max(out[l].activation_bytes, retained[l]);
      }
    }
    for (int l = 0; l < L; ++l) {
      auto& m = out[l];
      m.forward_ms_by_width.push_back(median(forward_samples[l]));
      m.backward_ms_by_width.push_back(median(backward_samples[l]));
      if (width == 1) {
        m.forward_samples = std::move(forward_samples[l]);
        m.backward_samples = std::move(backward_samples[l]);
      }
    }
  }
  const auto optimizer_ms = time_optimizer(layers, options, device);
  for (int l = 0; l < L; ++l) {
    auto& m = out[l];
    m.forward_ms = m.forward_ms_by_width.front();
    m.backward_ms = m.backward_ms_by_width.front();
    m.optimizer_ms = optimizer_ms[l];
  }
  torch::set_num_threads(1);
  return out;
}

double measure_device_staging(const device_spec& spec, std::int64_t bytes, int repeats) {
  if (spec.kind == "cpu") throw std::invalid_argument("measure_device_staging: a CPU tensor is sent as it is, not staged");
  if (bytes < 1 || repeats < 1) throw std::invalid_argument("measure_device_staging: need bytes >= 1 and repeats >= 1");
  const auto device = make_device(spec);
  const auto on_device = torch::ones({bytes / 4 + 1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  std::vector<double> ms;
  for (int i = 0; i < repeats + 2; ++i) {  // two warm-ups: the first copies allocate
    settle(device);
    const auto start = std::chrono::steady_clock::now();
    const auto host = on_device.to(torch::kCPU);  // as host_communicator stages a send
    const auto back = host.to(device);            // and lands a receive
    settle(device);
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(on_device.nbytes()) / std::max(median(ms), 1e-6);
}

std::function<void()> first_layers_op(const gpt_config& model, const profiler_options& options) {
  if (options.microbatch < 1) throw std::invalid_argument("profiler: microbatch must be >= 1");
  struct op_state {
    gpt_config model;
    torch::Device device;
    std::vector<std::shared_ptr<model_layer>> layers;
    torch::Tensor tokens;
    std::int64_t runs = 0;
  };
  const torch::Device device = make_device(options.device);
  runtime::use_one_compute_thread();
  // A model has at least one block (gpt_config's check), so these two are never its last layer.
  auto st = std::make_shared<op_state>(op_state{model, device, build_layers(model, 0, 2, device), {}});
  torch::manual_seed(static_cast<std::uint64_t>(model.seed));
  st->tokens = torch::randint(0, model.vocab, {options.microbatch, model.seq_len}, torch::kInt64).to(device);
  return [st] {
    torch::Tensor y = st->tokens;
    {
      const autocast_scope precision(st->model.precision, st->device);
      for (std::size_t l = 0; l < st->layers.size(); ++l) {
        auto dropout = dropout_generator(st->model, st->runs, 0, static_cast<int>(l), st->device);
        y = st->layers[l]->forward(y, &dropout);
      }
    }
    y.backward(torch::ones_like(y));
    settle(st->device);
    for (auto& layer : st->layers)
      for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
    ++st->runs;
  };
}

planning::profile make_profile(const gpt_config& model, const profiler_options& options,
                               const std::vector<layer_measurement>& layers, planning::link_profile link) {
  planning::profile p;
  p.model = (model.architecture == model_architecture::gpt2 ? "gpt2-" : "gpt-") + std::to_string(model.blocks) + "x" +
            std::to_string(model.d_model);
  p.config_hash = model.hash();
  p.device_kind = "cpu";
  p.device_memory_bytes = options.device_memory_bytes;
#ifdef OOBLECK_WITH_CUDA
  if (options.device.kind == "cuda") {
    p.device_kind = "cuda:" + cuda_device_name(options.device.index);
    // The job's budget, but never more than the GPU has: the planner then fits stages to the card.
    p.device_memory_bytes = std::min(p.device_memory_bytes, cuda_device_memory_bytes(options.device.index));
  }
#endif
  if (options.device.kind != "cpu" && p.device_kind == "cpu")
    throw std::invalid_argument("profiler: " + no_cuda_build_reason());
  // Timings in bf16 are not fp32's: a profile says which it measured.
  if (model.precision != precision_kind::fp32) p.device_kind += " " + precision_name(model.precision);
  p.microbatch_size = options.microbatch;
  p.gpus_per_node = options.slots_per_node;
  for (const auto& m : layers)
    p.layers.push_back({m.name, m.forward_ms_by_width, m.backward_ms_by_width, m.param_bytes, m.activation_bytes,
                        m.output_bytes, m.optimizer_ms});
  p.link = link;
  planning::validate(p);
  return p;
}

}  // namespace oobleck::runtime
