// The profiler measures what it claims: backward really runs, activation bytes are what autograd
// keeps, figures are stable, and a profile of another job is refused.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "apps/profile_command.hpp"
#include "apps/plan_command.hpp"
#include "messages/profile_json.hpp"
#include "runtime/profiler.hpp"

using namespace oobleck;

namespace {

runtime::gpt_config model() { return {.vocab = 128, .d_model = 64, .heads = 4, .blocks = 3, .seq_len = 32, .seed = 2}; }

}  // namespace

TEST_CASE("backward is measured, not derived from forward") {
  const auto layers = runtime::measure_layers(model(), {.microbatch = 4, .warmup = 1, .repeats = 5});
  REQUIRE(layers.size() == 5);
  std::vector<double> ratios;
  for (const auto& m : layers) {
    CHECK(m.forward_ms > 0);
    CHECK(m.backward_ms > 0);
    CHECK(m.backward_samples.size() == 5);
    ratios.push_back(m.backward_ms / m.forward_ms);
  }
  // A fixed multiple would give one ratio for every layer; embedding, blocks and head differ.
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  MESSAGE("backward / forward ratios from " << *lo << " to " << *hi);
  CHECK(*hi / *lo > 1.2);
}

TEST_CASE("activation bytes are what autograd retains, linear in the microbatch") {
  const auto c = model();
  const auto two = runtime::measure_layers(c, {.microbatch = 2, .warmup = 0, .repeats = 1});
  const auto four = runtime::measure_layers(c, {.microbatch = 4, .warmup = 0, .repeats = 1});
  const auto six = runtime::measure_layers(c, {.microbatch = 6, .warmup = 0, .repeats = 1});
  // The embedding keeps only its output [b, s, d] in fp32.
  CHECK(two[0].activation_bytes == 2 * c.seq_len * c.d_model * 4);
  CHECK(four[0].activation_bytes == 4 * c.seq_len * c.d_model * 4);
  // A block keeps far more than its output (attention probabilities, MLP inputs...): an amount
  // per sample plus the causal mask [s, s] (bool) that masked_fill saves once.
  CHECK(two[1].activation_bytes > 8 * 2 * c.seq_len * c.d_model * 4);
  const auto per_two_samples = four[1].activation_bytes - two[1].activation_bytes;
  CHECK(six[1].activation_bytes - four[1].activation_bytes == per_two_samples);
  CHECK(two[1].activation_bytes - per_two_samples == c.seq_len * c.seq_len);
  // The head keeps at least its logits [b, s, vocab].
  CHECK(four.back().activation_bytes >= 4 * c.seq_len * c.vocab * 4);
  for (std::size_t l = 0; l < two.size(); ++l) CHECK(two[l].param_bytes == four[l].param_bytes);
}

TEST_CASE("timings are stable across runs and across identical layers") {
  const auto a = runtime::measure_layers(model(), {.microbatch = 4, .warmup = 2, .repeats = 9});
  const auto b = runtime::measure_layers(model(), {.microbatch = 4, .warmup = 2, .repeats = 9});
  for (int l = 1; l <= 3; ++l) {  // the blocks: enough work to time reliably on a busy machine
    CAPTURE(l);
    CHECK(a[l].forward_ms / b[l].forward_ms == doctest::Approx(1.0).epsilon(1.0));  // within 2x
    CHECK(a[l].backward_ms / b[l].backward_ms == doctest::Approx(1.0).epsilon(1.0));
    CHECK(a[l].forward_ms / a[1].forward_ms == doctest::Approx(1.0).epsilon(1.0));
  }
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
  std::remove(job.c_str());
  std::remove(json.c_str());
}
