// How much slower a stage's op runs right after its thread blocked in a wait than back to back.
//
// The profiler (oobleck-profile, the profile at job start) times every layer as a stage runs it,
// but back to back: a microbatch's forward through the layers, then its backward. In a pipeline,
// most ops start right after the stage's thread blocked in a receive (the activation from the
// previous stage, the gradient from the next) while other threads ran on its core. This measures
// that difference on this machine, in one process, with the three kinds of ops alternating so
// that a drift of the machine's speed shows in all of them alike:
//   back to back   forward, then backward of the same microbatch, nothing between;
//   after a wait   before each of them, the thread blocks on a condition variable that another
//                  thread signals after --wait-us (a receive's wait);
//   after a spin   before each, the thread itself spins for --wait-us (a pause without blocking).
// With --busy N, N other threads run the same ops without pause meanwhile, each on a model of its
// own: the stages of other nodes that share the machine's cores (oobleck-local's nodes do).
// The op is the forward (and backward) of the first --layers layers of the job's model, one
// microbatch of the job's size, one intra-op thread: what the stage that runs them computes.
//
// usage: op_after_wait [--config JOB.toml] [--layers N] [--wait-us U] [--busy N] [--iterations N] [--quick] [--json PATH]

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/job_file.hpp"
#include "apps/local_options.hpp"
#include "bench/bench_flags.hpp"
#include "runtime/device.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/median.hpp"

using namespace oobleck;
using json = nlohmann::ordered_json;
using steady = std::chrono::steady_clock;

namespace {

double ms_between(steady::time_point a, steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void spin_for(std::chrono::microseconds d) {
  const auto until = steady::now() + d;
  while (steady::now() < until) {
  }
}

/// A thread that, asked, sleeps `delay` and then wakes the asker: the asker's wait is a blocked
/// thread woken by another, as in a receive (whose data the transport's I/O thread delivers).
class waker {
 public:
  explicit waker(std::chrono::microseconds delay) : delay_(delay), thread_([this] { loop(); }) {}
  ~waker() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Blocks until the other thread wakes this one.
  void wait() {
    std::unique_lock lock(mu_);
    asked_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !asked_; });
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return asked_ || quit_; });
      if (quit_) return;
      lock.unlock();
      std::this_thread::sleep_for(delay_);
      lock.lock();
      asked_ = false;
      cv_.notify_all();
    }
  }

  std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool asked_ = false, quit_ = false;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string config, json_path = "op_after_wait.json";
  int layers = 0, wait_us = 300, iterations = 1500, busy = 0;
  bool quick = false;
  oobleck::bench::flag_set app{
      "op_after_wait: times a stage's forward and backward op back to back, after its thread blocked in a\n"
      "wait another thread ends, and after it spun as long, alternating in one process; prints the\n"
      "medians and how much slower an op is after a blocking wait (what a pipeline stage's op\n"
      "pays that the profiler, timing back to back, does not see).",
      "op_after_wait"};
  app.add_text("--config", config, "the job file whose model is timed (default: oobleck-local's default job)");
  app.add_integer("--layers", layers, 0, 1 << 16,
                  "time the first N layers of the model as one op (default 0: half of them, as the first of 2 stages)");
  app.add_integer("--wait-us", wait_us, 0, 1'000'000, "how long each wait or spin lasts, microseconds (default 300)");
  app.add_integer("--iterations", iterations, 3, 10'000'000,
                  "microbatches timed, in turn back to back, after a wait, after a spin (default 1500)");
  app.add_integer(
      "--busy", busy, 0, 256,
      "N other threads compute the same ops without pause meanwhile (default 0; oobleck-local's nodes share cores)");
  app.add_switch("--quick", quick, "60 iterations (a smoke run)");
  app.add_text("--json", json_path, "write the results to PATH (default op_after_wait.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  if (quick) iterations = 60;

  apps::job_file job;
  try {
    job = config.empty() ? apps::parse_job(apps::default_local_job, "oobleck-local's default job")
                         : apps::read_job_file(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  const auto& model = job.model;
  const int L = model.num_layers();
  if (layers == 0) layers = std::max(1, L / 2);
  if (layers > L) {
    std::fprintf(stderr, "error: --layers %d: the model has %d layers\n", layers, L);
    return 2;
  }
  runtime::use_one_compute_thread();
  torch::manual_seed(static_cast<std::uint64_t>(model.seed));
  auto stage = runtime::build_layers(model, 0, layers, torch::kCPU);
  const std::int64_t b = job.training.microbatch;
  const auto tokens = torch::randint(0, model.vocab, {b, model.seq_len}, torch::kInt64);
  const auto targets = torch::randint(0, model.vocab, {b, model.seq_len}, torch::kInt64);
  const bool last = layers == L;
  // One forward and backward of the op on `layers_of` (a thread's own copy, or the measured one).
  auto forward_of = [&](std::vector<std::shared_ptr<runtime::model_layer>>& layers_of) {
    torch::Tensor x = tokens;
    for (auto& layer : layers_of) x = layer->forward(x, nullptr);
    return last ? runtime::lm_loss(x, targets) : x;
  };
  auto backward_of = [&](torch::Tensor& y) {
    if (last) y.backward();
    else y.backward(torch::ones_like(y));
  };
  auto clear_gradients = [](std::vector<std::shared_ptr<runtime::model_layer>>& layers_of) {
    for (auto& layer : layers_of)
      for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
  };
  std::atomic<bool> stop{false};
  std::vector<std::thread> others;
  for (int t = 0; t < busy; ++t)
    others.emplace_back([&, copy = runtime::build_layers(model, 0, layers, torch::kCPU)]() mutable {
      runtime::use_one_compute_thread();
      while (!stop.load()) {
        auto y = forward_of(copy);
        backward_of(y);
        clear_gradients(copy);
      }
    });

  enum mode { back_to_back = 0, after_wait = 1, after_spin = 2 };
  const char* names[] = {"back to back", "after a wait", "after a spin"};
  std::vector<double> forward[3], backward[3];
  waker other{std::chrono::microseconds(wait_us)};
  auto pause = [&](int m) {
    if (m == after_wait) other.wait();
    else if (m == after_spin) spin_for(std::chrono::microseconds(wait_us));
  };
  const int warmup = 20;
  for (int it = 0; it < warmup + iterations; ++it) {
    const int m = it % 3;
    pause(m);
    auto start = steady::now();
    auto y = forward_of(stage);
    const double f = ms_between(start, steady::now());
    pause(m);
    start = steady::now();
    backward_of(y);
    const double bw = ms_between(start, steady::now());
    clear_gradients(stage);
    if (it < warmup) continue;
    forward[m].push_back(f);
    backward[m].push_back(bw);
  }

  stop.store(true);
  for (auto& t : others) t.join();
  std::printf("op_after_wait: layers [0, %d) of %d (d_model %lld, %lld blocks, seq %lld), microbatch %lld, "
              "one thread; waits and spins of %d us; %d iterations (a third each); %d busy thread(s) beside\n",
              layers, L, static_cast<long long>(model.d_model), static_cast<long long>(model.blocks),
              static_cast<long long>(model.seq_len), static_cast<long long>(b), wait_us, iterations, busy);
  std::printf("%-14s %12s %12s %12s %16s\n", "", "forward ms", "backward ms", "op pair ms", "vs back to back");
  const double base = runtime::median(forward[0]) + runtime::median(backward[0]);
  json rows = json::array();
  for (int m = 0; m < 3; ++m) {
    const double f = runtime::median(forward[m]), bw = runtime::median(backward[m]);
    std::printf("%-14s %12.4f %12.4f %12.4f %15.3fx\n", names[m], f, bw, f + bw, (f + bw) / base);
    rows.push_back(json{{"mode", names[m]},
                        {"forward_ms", f},
                        {"backward_ms", bw},
                        {"pair_ms", f + bw},
                        {"vs_back_to_back", (f + bw) / base},
                        {"samples", forward[m].size()}});
  }
  std::ofstream(json_path) << json{{"benchmark", "op_after_wait"},
                                   {"layers", layers},
                                   {"model_layers", L},
                                   {"microbatch", b},
                                   {"wait_us", wait_us},
                                   {"busy_threads", busy},
                                   {"iterations", iterations},
                                   {"modes", rows}}
                                  .dump(2)
                           << "\n";
  return 0;
}
