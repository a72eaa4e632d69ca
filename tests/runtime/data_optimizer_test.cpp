// Dataset, learning-rate schedule and device seam.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "runtime/dataset.hpp"
#include "runtime/device.hpp"
#include "runtime/optimizer.hpp"

using namespace oobleck::runtime;

TEST_CASE("a sample's target is its input shifted by one byte") {
  const token_dataset data("abcdefghijklmnopqrstuvwxyz", 5);
  CHECK(data.size() == 5);  // (26 - 1) / 5
  const auto [in, out] = data.batch({0, 3});
  CHECK(in.sizes() == torch::IntArrayRef{2, 5});
  CHECK(in[0][0].item<int64_t>() == 'a');
  CHECK(out[0][0].item<int64_t>() == 'b');
  CHECK(in[1][0].item<int64_t>() == 'p');  // sample 3 starts at byte 15
  CHECK(out[1][4].item<int64_t>() == 'u');
  CHECK_THROWS_AS(data.batch({5}), std::out_of_range);
}

TEST_CASE("the default corpus is deterministic and the file loader names bad paths") {
  CHECK(default_corpus(4096, 1) == default_corpus(4096, 1));
  CHECK(default_corpus(4096, 1) != default_corpus(4096, 2));
  CHECK(default_corpus(4096).size() == 4096);
  try {
    token_dataset::from_file("/nonexistent/corpus.txt", 8);
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "cannot read corpus /nonexistent/corpus.txt");
  }
  const std::string path = "/tmp/oobleck-corpus-" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path) << "tiny";
  CHECK_THROWS_WITH_AS(token_dataset::from_file(path, 8), doctest::Contains("fewer than one sample"), std::runtime_error);
  std::remove(path.c_str());
}

TEST_CASE("learning rate: linear warm-up, cosine decay, then the floor") {
  const lr_schedule s{.peak = 1.0, .warmup_steps = 10, .total_steps = 110, .min_ratio = 0.1};
  CHECK(s.at(1) == doctest::Approx(0.1));
  CHECK(s.at(10) == doctest::Approx(1.0));
  CHECK(s.at(60) == doctest::Approx(0.55));  // half way through the cosine
  CHECK(s.at(110) == doctest::Approx(0.1));
  CHECK(s.at(500) == doctest::Approx(0.1));
  for (int k = 11; k < 110; ++k) CHECK(s.at(k + 1) <= s.at(k));
}

TEST_CASE("AdamW: bias-corrected first step moves each weight by about lr, decays matrices only") {
  auto w = torch::full({2, 2}, 1.0).requires_grad_(true);
  auto b = torch::full({2}, 1.0).requires_grad_(true);
  w.mutable_grad() = torch::full({2, 2}, 0.5);
  b.mutable_grad() = torch::full({2}, -0.5);
  auto state = initial_state({w, b});
  const adamw_options o{.weight_decay = 0.1, .lr = {.peak = 0.01, .warmup_steps = 0, .total_steps = 100}};
  adamw_step({w, b}, state, o);
  CHECK(state.step == 1);
  // w: decayed by lr * wd, then minus lr * m_hat / (sqrt(v_hat) + eps) = lr * sign(g); the first
  // step is already 1% into the cosine decay.
  const double lr = o.lr.at(1);
  CHECK(lr < 0.01);
  CHECK(w[0][0].item<double>() == doctest::Approx(1.0 * (1 - lr * 0.1) - lr).epsilon(1e-6));
  CHECK(b[0].item<double>() == doctest::Approx(1.0 + lr).epsilon(1e-6));
}

TEST_CASE("the device seam gives the CPU, and says why CUDA is unavailable") {
  CHECK(make_device(device_kind::cpu).is_cpu());
  CHECK(describe(make_device(device_kind::cpu)) == "cpu");
  CHECK(parse_device_kind("cuda") == device_kind::cuda);
  CHECK_THROWS_AS(parse_device_kind("tpu"), std::invalid_argument);
#ifndef OOBLECK_WITH_CUDA
  CHECK_THROWS_WITH_AS(make_device(device_kind::cuda), doctest::Contains("no CUDA support"), std::runtime_error);
#endif
}
