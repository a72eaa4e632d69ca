// The profiler measures what it claims: backward really runs, activation bytes are what autograd
// keeps, figures are stable, and a profile of another job is refused.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <unistd.h>

#include "apps/profile_command.hpp"
#include "apps/plan_command.hpp"
#include "messages/profile_json.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/link_profiler.hpp"
#include "runtime/profiler.hpp"

using namespace oobleck;

namespace {

runtime::gpt_config model() { return {.vocab = 128, .d_model = 64, .heads = 4, .blocks = 3, .seq_len = 32, .seed = 2}; }

/// 1/f < a/b < f.
bool within_factor(double a, double b, double f) {
  const double r = a / b;
  return r > 1 / f && r < f;
}

}  // namespace

TEST_CASE("backward is measured, not derived from forward") {
  // Under a virtual clock whose backward durations have a different ratio to forward in every
  // layer, the profile reports exactly the scripted backward times: a backward derived from the
  // forward (a fixed multiple, as the paper's code did) would give one ratio everywhere. Real
  // timings are too noisy on a loaded 2-core machine to assert a ratio spread.
  const auto c = model();
  const int L = c.num_layers(), repeats = 3;
  const std::vector<double> forward{0.2, 0.5, 0.6, 0.7, 0.3}, ratio{1.5, 3.0, 2.0, 4.0, 2.5};
  REQUIRE(static_cast<int>(forward.size()) == L);
  std::vector<double> script;  // per iteration: every layer's forward in order, then backward in reverse
  for (int it = 0; it < repeats; ++it) {
    for (int l = 0; l < L; ++l) script.push_back(forward[l]);
    for (int l = L - 1; l >= 0; --l) script.push_back(forward[l] * ratio[l]);
  }
  auto state = std::make_shared<std::pair<std::size_t, std::int64_t>>(0, 0);
  auto clock = [state, script] {
    if (state->first++ % 2 == 1) state->second += std::llround(script.at(state->first / 2 - 1) * 1000);
    return std::chrono::steady_clock::time_point(std::chrono::microseconds(state->second));
  };
  const auto layers = runtime::measure_layers(c, {.microbatch = 4, .warmup = 0, .repeats = repeats, .clock = clock});
  REQUIRE(layers.size() == static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) {
    CAPTURE(l);
    CHECK(layers[l].forward_ms == doctest::Approx(forward[l]).epsilon(1e-9));
    CHECK(layers[l].backward_ms == doctest::Approx(forward[l] * ratio[l]).epsilon(1e-9));
    CHECK(layers[l].backward_samples.size() == static_cast<std::size_t>(repeats));
  }
}

TEST_CASE("activation bytes are what autograd retains, linear in the microbatch") {
  const auto c = model();
  // The causal mask is built once per process (runtime::causal_mask): whichever measurement came
  // first would count it.
  runtime::causal_mask(c.seq_len, torch::kCPU);
  const auto two = runtime::measure_layers(c, {.microbatch = 2, .warmup = 0, .repeats = 1});
  const auto four = runtime::measure_layers(c, {.microbatch = 4, .warmup = 0, .repeats = 1});
  const auto six = runtime::measure_layers(c, {.microbatch = 6, .warmup = 0, .repeats = 1});
  // The embedding keeps only its output [b, s, d] in fp32.
  CHECK(two[0].activation_bytes == 2 * c.seq_len * c.d_model * 4);
  CHECK(four[0].activation_bytes == 4 * c.seq_len * c.d_model * 4);
  // A block keeps far more than its output (attention probabilities, MLP inputs...): an amount
  // per sample, and nothing else (the causal mask that masked_fill saves is the shared one).
  CHECK(two[1].activation_bytes > 8 * 2 * c.seq_len * c.d_model * 4);
  const auto per_two_samples = four[1].activation_bytes - two[1].activation_bytes;
  CHECK(six[1].activation_bytes - four[1].activation_bytes == per_two_samples);
  CHECK(two[1].activation_bytes == per_two_samples);
  // The head keeps at least its logits [b, s, vocab].
  CHECK(four.back().activation_bytes >= 4 * c.seq_len * c.vocab * 4);
  for (std::size_t l = 0; l < two.size(); ++l) CHECK(two[l].param_bytes == four[l].param_bytes);
}

TEST_CASE("figures are the median of the repeats: warm-up and preempted samples do not move them") {
  // The old check, a[l] / b[l] == Approx(1.0).epsilon(1.0), passed every positive ratio (Approx
  // passes |r - 1| < eps * (1 + max(|r|, 1)), its scale being 1). Real timings cannot be given a
  // bound that holds either: the medians of identical work differ up to 1.7x between runs at load
  // 2 and 10x at load 6 on 2 cores (bench/profiler_stability prints them; bench/RESULTS.md).
  // Under a virtual clock the bound is exact. Each layer's clean samples lie within 1.0x..1.16x of
  // its base; warm-up costs 100x; the scheduler preempts up to 4 of the 9 repeats (+20 ms). A
  // median of 9 with at most 4 outliers is one of the clean samples, so two runs, and identical
  // blocks of one run, agree within 1.16x whatever the outliers; a mean, a sum, a single sample
  // or a median that counted the warm-up would not.
  const auto c = model();
  const int L = c.num_layers(), warmup = 2, repeats = 9;
  auto run = [&](std::vector<int> preempted, double preemption_ms) {
    // Per iteration: every layer's forward ms in order, then every layer's backward ms in reverse.
    std::vector<double> script;
    for (int it = 0; it < warmup + repeats; ++it) {
      const int k = it - warmup;
      std::vector<double> f(L), b(L);
      for (int l = 0; l < L; ++l) {
        const double base = l == 0 || l == L - 1 ? 0.2 : 0.5;  // blocks: identical work
        f[l] = base * (1 + 0.02 * ((k * 5) % 9)), b[l] = 2.5 * f[l];  // a permutation of 1.00..1.16
        if (k < 0) f[l] *= 100, b[l] *= 100;
        else if (std::count(preempted.begin(), preempted.end(), k)) f[l] += preemption_ms, b[l] += preemption_ms;
      }
      script.insert(script.end(), f.begin(), f.end());
      script.insert(script.end(), b.rbegin(), b.rend());
    }
    // The profiler reads the clock before and after each forward and each backward.
    auto state = std::make_shared<std::pair<std::size_t, std::int64_t>>(0, 0);  // readings, now (us)
    auto clock = [state, script] {
      if (state->first++ % 2 == 1) state->second += std::llround(script.at(state->first / 2 - 1) * 1000);
      return std::chrono::steady_clock::time_point(std::chrono::microseconds(state->second));
    };
    auto m = runtime::measure_layers(c, {.microbatch = 2, .warmup = warmup, .repeats = repeats, .clock = clock});
    CHECK(state->first == 4 * script.size() / 2);  // every scripted duration was read, no more
    return m;
  };
  const auto a = run({0, 2, 4, 6}, 20);
  const auto b = run({1, 8, 3}, 35);
  const auto clean = run({}, 0);
  for (int l = 0; l < L; ++l) {
    CAPTURE(l);
    REQUIRE(a[l].forward_samples.size() == static_cast<std::size_t>(repeats));  // warm-up left out
    const double base = l == 0 || l == L - 1 ? 0.2 : 0.5;
    for (const auto* m : {&a[l], &b[l], &clean[l]}) {
      CHECK(m->forward_ms >= doctest::Approx(base));
      CHECK(m->forward_ms <= doctest::Approx(base * 1.16));
      CHECK(m->backward_ms >= doctest::Approx(2.5 * base));
      CHECK(m->backward_ms <= doctest::Approx(2.5 * base * 1.16));
    }
    CHECK(within_factor(a[l].forward_ms, b[l].forward_ms, 1.16 + 1e-9));
    CHECK(within_factor(a[l].backward_ms, b[l].backward_ms, 1.16 + 1e-9));
    if (l >= 1 && l <= 3) CHECK(within_factor(a[l].forward_ms, a[1].forward_ms, 1.16 + 1e-9));
  }
  // With no outliers the median is the middle clean sample exactly: 1.08x the base.
  CHECK(clean[1].forward_ms == doctest::Approx(0.5 * 1.08).epsilon(1e-9));
}

TEST_CASE("within_factor is a bound: inside passes, beyond fails on either side") {
  CHECK(within_factor(1.15, 1, 1.16));
  CHECK(within_factor(1, 1.15, 1.16));
  CHECK_FALSE(within_factor(1.17, 1, 1.16));
  CHECK_FALSE(within_factor(1, 1.17, 1.16));
  CHECK_FALSE(within_factor(10, 1, 1.16));
}

TEST_CASE("with M slots per node every width d <= M is measured with d intra-op threads") {
  // The runtime runs a stage of width d with d LibTorch intra-op threads (actors/stage.cpp), so
  // the profiler times width d with d threads: the virtual clock records the measuring thread's
  // thread count at every reading, and scripts width 2 as 0.6 of width 1.
  const auto c = model();
  const int L = c.num_layers(), repeats = 2;
  auto readings = std::make_shared<std::vector<int>>();
  auto now = std::make_shared<std::int64_t>(0);
  auto clock = [readings, now] {
    const int threads = torch::get_num_threads();
    const bool end = readings->size() % 2 == 1;  // start, end, start, end, ...
    readings->push_back(threads);
    if (end) *now += threads == 1 ? 1000 : 600;  // microseconds
    return std::chrono::steady_clock::time_point(std::chrono::microseconds(*now));
  };
  const runtime::profiler_options options{.microbatch = 2, .warmup = 0, .repeats = repeats, .slots_per_node = 2, .clock = clock};
  const auto layers = runtime::measure_layers(c, options);
  CHECK(torch::get_num_threads() == 1);  // one thread again afterwards
  // Width 1 (repeats x every layer's forward and backward, 2 readings each), then width 2.
  REQUIRE(readings->size() == static_cast<std::size_t>(L * 2 * repeats * 4));
  for (std::size_t i = 0; i < readings->size(); ++i) {
    CAPTURE(i);
    CHECK((*readings)[i] == (i < static_cast<std::size_t>(L * repeats * 4) ? 1 : 2));
  }
  for (const auto& m : layers) {
    REQUIRE(m.forward_ms_by_width.size() == 2);
    CHECK(m.forward_ms_by_width[0] == doctest::Approx(1.0));
    CHECK(m.forward_ms_by_width[1] == doctest::Approx(0.6));
    CHECK(m.backward_ms_by_width[1] == doctest::Approx(0.6));
    CHECK(m.forward_ms == m.forward_ms_by_width[0]);
  }
  const auto p = runtime::make_profile(c, options, layers);
  CHECK(p.gpus_per_node == 2);
  CHECK(p.layers.front().forward_ms == std::vector<double>{1.0, 0.6});
  CHECK_NOTHROW(planning::check_matches(p, {.gpus_per_node = 2}));
  CHECK_THROWS_AS(planning::check_matches(p, {.gpus_per_node = 1}), planning::planning_error);
  CHECK_THROWS_AS(runtime::measure_layers(c, {.slots_per_node = 3}), std::invalid_argument);
}

TEST_CASE("a profile carries its job's identity and is refused for another job") {
  auto c = model();
  const runtime::profiler_options options{.microbatch = 4, .warmup = 0, .repeats = 1};
  const auto p = runtime::make_profile(c, options, runtime::measure_layers(c, options));
  CHECK(p.config_hash == c.hash());
  CHECK(p.device_kind == "cpu");
  CHECK_NOTHROW(planning::check_matches(p, {.microbatch_size = 4, .config_hash = c.hash()}));
  auto other = c;
  other.d_model = 32;
  CHECK(other.hash() != c.hash());
  CHECK_THROWS_AS(planning::check_matches(p, {.config_hash = other.hash()}), planning::planning_error);
  CHECK_THROWS_AS(planning::check_matches(p, {.microbatch_size = 8}), planning::planning_error);
}

TEST_CASE("a bf16 profile says so in its device kind, and is refused for an fp32 job on the same device") {
  auto c = model();
  c.precision = runtime::precision_kind::bf16;
  const runtime::profiler_options options{.microbatch = 4, .warmup = 0, .repeats = 1};
  const auto p = runtime::make_profile(c, options, runtime::measure_layers(c, options));
  CHECK(p.device_kind == "cpu bf16");
  CHECK(p.config_hash == c.hash());
  CHECK_THROWS_AS(planning::check_matches(p, {.device_kind = "cpu"}), planning::planning_error);
}

TEST_CASE("oobleck-profile --json feeds oobleck-plan directly") {
  const std::string job = "/tmp/oobleck-profile-job-" + std::to_string(::getpid()) + ".toml";
  const std::string json = "/tmp/oobleck-profile-" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream(job) << "[model]\nblocks = 2\nd_model = 32\nseq_len = 16\n[training]\nmicrobatch = 2\n"
                          "[profile]\nwarmup = 0\nrepeats = 2\n";
  }
  std::ostringstream out, err;
  REQUIRE(apps::run_profile_command({"--config", job, "--json", "--out", json}, out, err) == 0);
  CHECK(err.str().find("block1") != std::string::npos);  // the per-layer table
  const auto p = messages::profile_from_json(out.str());
  CHECK(p.num_layers() == 4);
  CHECK(err.str().find("link (loopback, host data plane): latency") != std::string::npos);
  CHECK(p.link.latency_ms > 0);  // measured by default
  CHECK(p.link.bytes_per_ms > 0);
  std::ostringstream plan_out, plan_err;
  CHECK(apps::run_plan_command({"--profile", json, "--nodes", "3", "--fault-tolerance", "1", "--global-batch", "8",
                                "--microbatch", "2", "--json"},
                               plan_out, plan_err) == 0);
  std::ostringstream bad_out, bad_err;
  {
    std::ofstream(job) << "[model]\nblokcs = 2\n";
  }
  CHECK(apps::run_profile_command({"--config", job}, bad_out, bad_err) == 2);
  CHECK(bad_err.str().find(":2: unknown key model.blokcs") != std::string::npos);
  // The link: given instead of measured, or none; half a link, or both ways at once, is refused.
  std::ostringstream given_out, given_err;
  std::ofstream(job) << "[model]\nblocks = 1\nd_model = 16\nseq_len = 8\n[profile]\nwarmup = 0\nrepeats = 1\n";
  REQUIRE(apps::run_profile_command({"--config", job, "--json", "--link-latency-ms", "0.02", "--link-gbytes-per-s", "12.5"},
                                    given_out, given_err) == 0);
  CHECK(messages::profile_from_json(given_out.str()).link == planning::link_profile{0.02, 12.5e6});
  CHECK(given_err.str().find("link (loopback") == std::string::npos);
  std::ostringstream none_out, none_err;
  REQUIRE(apps::run_profile_command({"--config", job, "--json", "--no-link"}, none_out, none_err) == 0);
  CHECK(messages::profile_from_json(none_out.str()).link == planning::link_profile{});
  for (const auto& args : {std::vector<std::string>{"--config", job, "--json", "--link-latency-ms", "0.02"},
                           std::vector<std::string>{"--config", job, "--json", "--no-link", "--link-latency-ms", "1",
                                                    "--link-gbytes-per-s", "1"},
                           std::vector<std::string>{"--config", job, "--json", "--link-latency-ms", "-1",
                                                    "--link-gbytes-per-s", "1"}}) {
    std::ostringstream o2, e2;
    CHECK(apps::run_profile_command(args, o2, e2) == 2);
    CHECK(e2.str().find("error: ") == 0);
  }
  std::remove(job.c_str());
  std::remove(json.c_str());
}

TEST_CASE("the profile carries each layer's output bytes and AdamW time, and the link it is given") {
  const runtime::gpt_config c{.vocab = 64, .d_model = 16, .heads = 2, .blocks = 2, .seq_len = 8};
  const runtime::profiler_options o{.microbatch = 3, .warmup = 1, .repeats = 3};
  const auto layers = runtime::measure_layers(c, o);
  REQUIRE(layers.size() == 4);
  for (int l = 0; l < 3; ++l) CHECK(layers[l].output_bytes == 3 * 8 * 16 * 4);  // b x seq x d_model floats
  CHECK(layers[3].output_bytes == 0);  // the head's output is the loss: never sent
  for (const auto& m : layers) CHECK(m.optimizer_ms > 0);
  const auto p = runtime::make_profile(c, o, layers, {0.05, 1e6});
  CHECK(p.link == planning::link_profile{0.05, 1e6});
  CHECK(p.layers[1].output_bytes == layers[1].output_bytes);
  CHECK(p.layers[1].optimizer_ms == layers[1].optimizer_ms);
  CHECK(runtime::make_profile(c, o, layers).link == planning::link_profile{});
}

TEST_CASE("device tensors' staging through host memory slows the link's bytes, not its latency") {
  const planning::link_profile wire{.latency_ms = 0.05, .bytes_per_ms = 2e6};
  const auto staged = runtime::with_staging(wire, 2e6);
  CHECK(staged.latency_ms == wire.latency_ms);
  CHECK(staged.bytes_per_ms == doctest::Approx(1e6));  // the wire, then the staging: half the rate
  CHECK(runtime::with_staging(wire, 1e12).bytes_per_ms == doctest::Approx(2e6).epsilon(1e-5));
  CHECK(runtime::with_staging({.latency_ms = 0.05, .bytes_per_ms = 0}, 3e6).bytes_per_ms == 3e6);  // free wire
  CHECK_THROWS_AS(runtime::with_staging(wire, 0), std::invalid_argument);
  // On the CPU nothing is staged: asking to measure it is a mistake, not a zero.
  CHECK_THROWS_AS(runtime::measure_device_staging({"cpu", 0}, 1 << 20, 3), std::invalid_argument);
}

TEST_CASE("the loopback link measurement: a round trip per repeat, latency and bandwidth from them") {
  const auto m = runtime::measure_loopback_link(5, 64, 1 << 20);
  CHECK(m.round_trip_ms.size() == 5);
  CHECK(m.bulk_ms.size() == 5);
  CHECK(m.link.latency_ms > 0);
  CHECK(m.link.latency_ms < 1000);
  CHECK(m.link.bytes_per_ms > 0);
  std::vector<double> rt = m.round_trip_ms;
  std::sort(rt.begin(), rt.end());
  CHECK(m.link.latency_ms == doctest::Approx(rt[2] / 2));
  CHECK_THROWS_AS(runtime::measure_loopback_link(0), std::invalid_argument);
  CHECK(m.waited_ms.empty());  // no op: the idle latency
  CHECK(m.idle_latency_ms == m.link.latency_ms);
}

TEST_CASE("first_layers_op: a microbatch through the embedding and the first block and back, run after run") {
  const auto op = runtime::first_layers_op(model(), {.microbatch = 2});
  for (int i = 0; i < 3; ++i) CHECK_NOTHROW(op());
  CHECK_THROWS_AS(runtime::first_layers_op(model(), {.microbatch = 0}), std::invalid_argument);
}

TEST_CASE("the loopback link measurement with an op: the latency a stage that waited sees, the op's cold start in it") {
  // An op that is 2 ms slower right after a receive than right after itself: the measurement runs
  // it twice back to back (timing the second), then once as soon as a held message arrives.
  int calls = 0;
  auto op = [&calls] {
    if (calls++ % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  const auto m = runtime::measure_loopback_link(8, 64, 1 << 16, op, std::chrono::microseconds(300));
  REQUIRE(m.waited_ms.size() >= 3);
  CHECK(m.waited_ms.size() == m.op_ms.size());
  CHECK(m.idle_latency_ms > 0);
  // The 2 ms the op loses after a wait are the message's, as the stage sees it (a loaded machine
  // adds to it; the held time itself does not count: it ends where the send starts). sleep_for
  // sleeps at least the 2 ms and the message's transit comes on top, against an op timed alone
  // that takes well under a microsecond: more than 2 ms whatever the load. The idle figure is no
  // bound here: it is measured at other moments (idle + 1.9 failed once under the parallel unit
  // suite with an idle figure below 0.5 ms; two CPU hogs make it 2-4 ms).
  INFO("idle latency " << m.idle_latency_ms << " ms, latency " << m.link.latency_ms << " ms");
  CHECK(m.link.latency_ms > 2.0);
  CHECK(m.link.latency_ms >= m.idle_latency_ms);
  CHECK(m.link.latency_ms < m.idle_latency_ms + 2 + 50);
  // An op that costs the same either way leaves the idle latency, or a little more.
  const auto same = runtime::measure_loopback_link(8, 64, 1 << 16, [] {}, std::chrono::microseconds(300));
  CHECK(same.link.latency_ms >= same.idle_latency_ms);
  CHECK(same.link.latency_ms < same.idle_latency_ms + 50);
  // At most `repeats` of each, and about `op_budget` of them (3 at least).
  int slow_calls = 0;
  const auto bounded = runtime::measure_loopback_link(
      1000, 64, 1 << 16, [&slow_calls] { ++slow_calls, std::this_thread::sleep_for(std::chrono::milliseconds(5)); },
      std::chrono::microseconds(0), std::chrono::milliseconds(50));
  CHECK(bounded.waited_ms.size() >= 3);
  CHECK(bounded.waited_ms.size() < 20);
}
