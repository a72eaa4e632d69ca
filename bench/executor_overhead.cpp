// Stage executor against the plain LibTorch loop on the same model, batch and microbatches:
// a 1-stage pipeline should cost nothing over gradient accumulation by hand (target: >= 0.95 of
// the plain loop's throughput).
//
// usage: executor_overhead [--quick] [--json PATH] [--device cpu|cuda[:N]] [--preset gpt2] [--seq-len N]
//                          [--microbatch N] [--steps N] [--precision fp32|bf16]
//
// Built a second time as gpu_executor_overhead in a CUDA build (scripts/gpu/test.sh runs it): the
// same comparison on the GPU for GPT-2 small by default (fp32 unless --precision bf16, untied embeddings and no dropout in
// both loops, so that the two do the same work), each step timed to the device's completion.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "runtime/device.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/dataset.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stage_executor.hpp"

using namespace oobleck;
using json = nlohmann::ordered_json;

namespace {

/// A single stage never communicates; any call is a bug.
class no_communicator final : public runtime::communicator {
 public:
  int rank() const override { return 0; }
  void send(const torch::Tensor&, int, int) override { throw runtime::comm_error("unexpected send"); }
  void recv(torch::Tensor&, int, int) override { throw runtime::comm_error("unexpected recv"); }
  void all_reduce_sum(torch::Tensor&, const std::vector<int>&, int) override { throw runtime::comm_error("unexpected"); }
  void broadcast(torch::Tensor&, int, const std::vector<int>&, int) override { throw runtime::comm_error("unexpected"); }
  void abort() override {}
};

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
#ifdef OOBLECK_GPU_BENCH
  const std::string name = "gpu_executor_overhead";
  std::string device_text = "cuda", preset = "gpt2";
  std::int64_t seq_len = 1024;
#else
  const std::string name = "executor_overhead";
  std::string device_text = "cpu", preset;
  std::int64_t seq_len = 0;
#endif
  std::string json_path = name + ".json";
  int microbatch = 4, steps = 0;
  std::string precision_text = "fp32";
  oobleck::bench::flag_set app{name +
                                   ": step time of a 1-stage pipeline (stage executor, 1F1B ops) against a plain\n"
                                   "LibTorch loop with the same gradient accumulation and AdamW, one intra-op thread.",
                               name};
  app.add_switch("--quick", quick, "a smaller model and fewer steps (a smoke run)");
  app.add_text("--json", json_path, "write the results to PATH (default " + name + ".json)");
  app.add_text("--device", device_text, "cpu, cuda or cuda:N (default " + device_text + ")").type_name("cpu|cuda[:N]");
  app.add_text("--preset", preset,
               "a GPT-2 size (gpt2, gpt2-medium, ...), untied and without dropout (default: " +
                   (preset.empty() ? std::string("a small oobleck-gpt") : preset) + ")")
      .type_name("NAME");
  app.add_integer("--seq-len", seq_len, 1, 1 << 20, "sequence length (default: the model's)");
  app.add_integer("--microbatch", microbatch, 1, 1 << 20, "samples per microbatch (default 4)");
  app.add_integer("--steps", steps, 1, 1 << 20, "timed steps per round (default 12, 2 with --quick)");
  app.add_text("--precision", precision_text,
               "fp32, or bf16: autocast around both loops' forwards, fp32 parameters and AdamW (default fp32)")
      .type_name("fp32|bf16");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  runtime::use_one_compute_thread();
  runtime::device_spec spec;
  torch::Device device = torch::kCPU;
  runtime::gpt_config model{.vocab = 256, .d_model = quick ? 64 : 256, .heads = 8, .blocks = 4,
                            .seq_len = quick ? 32 : 128, .seed = 1};
  try {
    spec = runtime::parse_device_spec(device_text);
    device = runtime::make_device(spec);
    if (!preset.empty()) model = runtime::preset(preset);
    model.precision = runtime::parse_precision(precision_text);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  if (!preset.empty()) {
    model.tie_embeddings = false;  // the plain loop has no tied pair
    model.dropout = 0;             // the plain loop draws no masks
    model.seed = 1;
    if (quick) model.blocks = 2;
  }
  if (seq_len > 0) model.seq_len = seq_len;
  if (quick && !preset.empty()) model.seq_len = std::min<std::int64_t>(model.seq_len, 128);
  const int microbatches = 8, warmup = 2;  // per round
  if (steps == 0) steps = quick ? 2 : 12;
  // A step ends when the device has finished it: CUDA queues work and returns.
  const auto finish = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  const runtime::adamw_options adamw;
  const runtime::token_dataset data(runtime::default_corpus(1 << 20), model.seq_len);
  const runtime::sampler sampler(1, data.size(), microbatch * microbatches);

  std::vector<double> plain, staged;
  auto round = [&](bool plain_first) {
    // Plain loop: all layers, microbatches accumulated by hand.
    std::vector<std::shared_ptr<runtime::model_layer>> layers;
    if (plain_first) layers = runtime::build_layers(model, 0, model.num_layers(), device);
    // The same work through the stage executor. Which model is allocated first changes where its
    // weights land and measurably its speed, so rounds are run in both orders.
    no_communicator comm;
    runtime::layer_store store(model, device);
    store.ensure(0, model.num_layers());
    runtime::stage_executor executor(store, {0, model.num_layers(), 0, 1, -1, -1}, comm,
                                     {.microbatch_size = microbatch, .global_microbatches = microbatches, .optimizer = adamw});
    if (!plain_first) layers = runtime::build_layers(model, 0, model.num_layers(), device);
    std::vector<runtime::layer_optimizer_state> states;
    for (auto& l : layers) states.push_back(runtime::initial_state(l->parameters()));
    auto plain_step = [&](const torch::Tensor& in, const torch::Tensor& out) {
      for (int m = 0; m < microbatches; ++m) {
        torch::Tensor h = in.slice(0, m * microbatch, (m + 1) * microbatch).to(device), loss;
        {
          const runtime::autocast_scope cast(model.precision, device);
          for (auto& l : layers) h = l->forward(h);
          loss = runtime::lm_loss(h, out.slice(0, m * microbatch, (m + 1) * microbatch).to(device)) / microbatches;
        }
        loss.backward();
      }
      for (std::size_t i = 0; i < layers.size(); ++i) {
        runtime::adamw_step(layers[i]->parameters(), states[i], adamw);
        for (auto& p : layers[i]->parameters()) p.mutable_grad() = torch::Tensor();
      }
      finish();
    };
    const std::vector<std::vector<int>> groups(model.num_layers(), std::vector<int>{0});
    auto staged_step = [&](const torch::Tensor& in, const torch::Tensor& out) {
      executor.run_step(0, 0, microbatches, in, out);
      executor.reduce_gradients(groups);
      executor.commit();
      finish();
    };
    // Interleaved, alternating which goes first, so drift in the machine's speed hits both alike.
    auto timed = [](const auto& f) {
      const auto start = std::chrono::steady_clock::now();
      f();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    for (int step = 0; step < warmup + steps; ++step) {
      const auto [in, out] = data.batch(sampler.step_samples(step));
      double a = 0, b = 0;
      if (step % 2 == 0) {
        a = timed([&] { plain_step(in, out); });
        b = timed([&] { staged_step(in, out); });
      } else {
        b = timed([&] { staged_step(in, out); });
        a = timed([&] { plain_step(in, out); });
      }
      if (step < warmup) continue;
      plain.push_back(a);
      staged.push_back(b);
    }
  };
  round(true);
  round(false);

  // Each step's pair ran back to back: the median of the per-step ratios cancels the machine's
  // drift better than the ratio of medians.
  std::vector<double> ratios;
  for (std::size_t i = 0; i < plain.size(); ++i) ratios.push_back(plain[i] / staged[i]);
  const double p = median(plain), s = median(staged), ratio = median(ratios);
  char line[200];
  std::printf("model: %s, d_model %lld, %lld blocks, seq %lld; %d microbatches of %d; %s; on %s; median of 2 x %d steps (both allocation orders)\n",
              preset.empty() ? "oobleck-gpt" : preset.c_str(), static_cast<long long>(model.d_model),
              static_cast<long long>(model.blocks), static_cast<long long>(model.seq_len), microbatches, microbatch,
              runtime::precision_name(model.precision).c_str(), runtime::to_string(spec).c_str(), steps);
  std::printf("%-28s %12s %14s\n", "", "step ms", "samples/s");
  std::snprintf(line, sizeof line, "%-28s %12.2f %14.1f\n", "plain LibTorch loop", p, microbatch * microbatches * 1000.0 / p);
  std::cout << line;
  std::snprintf(line, sizeof line, "%-28s %12.2f %14.1f\n", "stage executor (1 stage)", s, microbatch * microbatches * 1000.0 / s);
  std::cout << line;
  std::printf("executor throughput / plain throughput = %.3f (median of per-step ratios; target >= 0.95)\n", ratio);
  std::ofstream(json_path) << json{{"benchmark", name},
                                   {"device", runtime::to_string(spec)},
                                   {"model", preset.empty() ? "oobleck-gpt" : preset},
                                   {"d_model", model.d_model},
                                   {"blocks", model.blocks},
                                   {"seq_len", model.seq_len},
                                   {"microbatch", microbatch},
                                   {"microbatches", microbatches},
                                   {"precision", runtime::precision_name(model.precision)},
                                   {"plain_step_ms", p},
                                   {"executor_step_ms", s},
                                   {"throughput_ratio", ratio}}
                                  .dump(2)
                           << "\n";
  return 0;
}
