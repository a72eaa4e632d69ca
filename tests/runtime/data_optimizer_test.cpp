// Dataset, AdamW and device seam (the learning-rate schedule: optimizer_options_test).
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "runtime/dataset.hpp"
#include "runtime/device.hpp"
#include "runtime/optimizer.hpp"
#include "support/torch_adamw.hpp"

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
  const double lr = learning_rate(o.lr, 1);
  CHECK(lr < 0.01);
  CHECK(w[0][0].item<double>() == doctest::Approx(1.0 * (1 - lr * 0.1) - lr).epsilon(1e-6));
  CHECK(b[0].item<double>() == doctest::Approx(1.0 + lr).epsilon(1e-6));
}

TEST_CASE("AdamW follows torch::optim::AdamW for 50 steps: parameters, moments and step count") {
  // One step pins only the first update, where bias correction makes m_hat / sqrt(v_hat) = sign(g):
  // moments or bias correction wrong from step 2 on would pass it. Here the project's AdamW and
  // LibTorch's run side by side on the same loss, with weight decay on (matrices only, as both are
  // set up), bias correction, amsgrad off, and a warm-up and cosine learning-rate schedule.
  const adamw_options o{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .lr = {.peak = 1e-2, .warmup_steps = 5, .total_steps = 50, .min_lr = 1e-3}};
  torch::manual_seed(4);
  const auto x = torch::randn({32, 16});
  const auto y = torch::randn({32, 8}).tanh();
  const auto w0 = torch::randn({16, 8}) * 0.3;
  const auto b0 = torch::randn({8}) * 0.1;
  auto ours = std::vector<torch::Tensor>{w0.clone().requires_grad_(true), b0.clone().requires_grad_(true)};
  auto theirs = std::vector<torch::Tensor>{w0.clone().requires_grad_(true), b0.clone().requires_grad_(true)};
  auto loss = [&](const std::vector<torch::Tensor>& p) {
    return (torch::tanh(torch::matmul(x, p[0]) + p[1]) - y).pow(2).mean();
  };
  auto state = initial_state(ours);
  auto reference = oobleck::testing::torch_adamw(theirs, o);
  // ||a - b|| / ||b||: the parameters stay O(1) and the moments nonzero, so no norm is near 0.
  auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).norm().item<double>() / b.norm().item<double>();
  };
  double worst = 0;
  for (int step = 1; step <= 50; ++step) {
    CAPTURE(step);
    // Both get the same gradients (of the loss at our parameters): what differs is only what the
    // optimizers do with them, not a trajectory that amplifies rounding.
    loss(ours).backward();
    for (std::size_t i = 0; i < ours.size(); ++i) theirs[i].mutable_grad() = ours[i].grad().clone();
    adamw_step(ours, state, o);
    for (auto& p : ours) p.mutable_grad() = torch::Tensor();
    oobleck::testing::set_learning_rate(*reference, o.lr, step);
    reference->step();
    for (auto& p : theirs) p.mutable_grad() = torch::Tensor();
    REQUIRE(state.step == step);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      CAPTURE(i);
      const auto& s = oobleck::testing::torch_adamw_state(*reference, theirs[i]);
      REQUIRE(s.step() == step);
      const double p = relative(ours[i].detach(), theirs[i].detach());
      const double m = relative(state.exp_avg[i], s.exp_avg());
      const double v = relative(state.exp_avg_sq[i], s.exp_avg_sq());
      worst = std::max({worst, p, m, v});
      CHECK(p < 1e-6);
      CHECK(m < 1e-6);
      CHECK(v < 1e-6);
    }
  }
  MESSAGE("50 AdamW steps: largest relative difference from torch::optim::AdamW " << worst);
  // The run did move the weights (the comparison is not between two copies of w0).
  CHECK(relative(ours[0].detach(), w0) > 0.1);
}

TEST_CASE("matrix ranges: where the matrices lie in a flat buffer, adjacent ones merged") {
  const auto m = [](std::int64_t r, std::int64_t c) { return torch::zeros({r, c}); };
  const auto v = [](std::int64_t n) { return torch::zeros({n}); };
  CHECK(matrix_ranges({m(2, 3), v(3), m(4, 2), m(1, 5), v(2)}) == element_ranges{{0, 6}, {9, 22}});
  CHECK(matrix_ranges({v(4), v(2)}).empty());
}

TEST_CASE("flat AdamW over a layer's buffers follows torch::optim::AdamW for 50 steps, decaying matrices only") {
  // The layer store's layout: every tensor a view of one flat buffer per quantity, matrices and
  // vectors interleaved (a bias between two matrices), so decay must skip the bias.
  const adamw_options o{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .lr = {.peak = 1e-2, .warmup_steps = 5, .total_steps = 50, .min_lr = 1e-3}};
  torch::manual_seed(5);
  const auto x = torch::randn({32, 16});
  const auto y = torch::randn({32, 8}).tanh();
  const std::vector<torch::Tensor> initial{torch::randn({16, 8}) * 0.3, torch::randn({8}) * 0.1,
                                           torch::randn({8, 8}) * 0.3};
  std::int64_t n = 0;
  for (const auto& t : initial) n += t.numel();
  flat_adamw_buffers flat{torch::empty({n}), torch::zeros({n}), torch::zeros({n}), torch::zeros({n})};
  std::vector<torch::Tensor> ours, theirs, exp_avg, exp_avg_sq;
  std::int64_t offset = 0;
  for (const auto& t : initial) {
    auto view = [&](const torch::Tensor& f) { return f.slice(0, offset, offset + t.numel()).view(t.sizes()); };
    ours.push_back(view(flat.parameters));
    ours.back().copy_(t);
    ours.back().requires_grad_(true);
    ours.back().mutable_grad() = view(flat.gradients);
    exp_avg.push_back(view(flat.exp_avg));
    exp_avg_sq.push_back(view(flat.exp_avg_sq));
    theirs.push_back(t.clone().requires_grad_(true));
    offset += t.numel();
  }
  const auto decayed = matrix_ranges(ours);
  REQUIRE(decayed == element_ranges{{0, 128}, {136, 200}});
  auto loss = [&](const std::vector<torch::Tensor>& p) {
    return (torch::tanh(torch::matmul(torch::tanh(torch::matmul(x, p[0]) + p[1]), p[2])) - y).pow(2).mean();
  };
  auto reference = oobleck::testing::torch_adamw(theirs, o);
  auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).norm().item<double>() / b.norm().item<double>();
  };
  std::int64_t step = 0;
  double worst = 0;
  for (int k = 1; k <= 50; ++k) {
    CAPTURE(k);
    flat.gradients.zero_();
    loss(ours).backward();  // into the flat gradient buffer, through the .grad() views
    for (std::size_t i = 0; i < ours.size(); ++i) theirs[i].mutable_grad() = ours[i].grad().clone();
    flat_adamw_step(flat, decayed, step, o);
    oobleck::testing::set_learning_rate(*reference, o.lr, k);
    reference->step();
    for (auto& p : theirs) p.mutable_grad() = torch::Tensor();
    REQUIRE(step == k);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      CAPTURE(i);
      const auto& s = oobleck::testing::torch_adamw_state(*reference, theirs[i]);
      const double p = relative(ours[i].detach(), theirs[i].detach());
      const double m = relative(exp_avg[i], s.exp_avg());
      const double v = relative(exp_avg_sq[i], s.exp_avg_sq());
      worst = std::max({worst, p, m, v});
      CHECK(p < 1e-6);
      CHECK(m < 1e-6);
      CHECK(v < 1e-6);
    }
  }
  MESSAGE("50 flat AdamW steps: largest relative difference from torch::optim::AdamW " << worst);
  CHECK(relative(ours[0].detach(), initial[0]) > 0.1);
  CHECK_THROWS_AS(flat_adamw_step({flat.parameters, flat.gradients.slice(0, 1), flat.exp_avg, flat.exp_avg_sq},
                                  decayed, step, o),
                  std::invalid_argument);
}

TEST_CASE("flat AdamW: elements updated four at a time and one by one agree to the bit") {
  // On the CPU the update runs four elements at a time and the rest of each range one by one; which
  // elements go which way depends on where the decayed ranges cut the buffer. Without weight decay
  // the ranges change no value, so two cuts of the same buffer must give the same bits everywhere.
  const std::int64_t n = 103;
  torch::manual_seed(11);
  const auto p0 = torch::randn({n}), m0 = torch::randn({n}) * 0.01, v0 = torch::rand({n}) * 0.01;
  const adamw_options o{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0,
                        .lr = {.peak = 1e-2, .warmup_steps = 0, .total_steps = 10, .min_lr = 1e-3}};
  auto run = [&](const element_ranges& cut) {
    flat_adamw_buffers b{p0.clone(), torch::zeros({n}), m0.clone(), v0.clone()};
    std::int64_t step = 0;
    for (int k = 1; k <= 3; ++k) {
      b.gradients.copy_(torch::randn({n}, torch::TensorOptions().dtype(torch::kFloat32)) * k);
      flat_adamw_step(b, cut, step, o);
    }
    return b;
  };
  torch::manual_seed(12);
  const auto whole = run({});  // one range: elements 100-102 one by one
  torch::manual_seed(12);
  const auto cut = run({{1, 2}, {50, 53}});  // 0, 1, 50-52, 101, 102 one by one; 100 four at a time
  CHECK(torch::equal(whole.parameters, cut.parameters));
  CHECK(torch::equal(whole.exp_avg, cut.exp_avg));
  CHECK(torch::equal(whole.exp_avg_sq, cut.exp_avg_sq));
  CHECK(!torch::equal(whole.parameters, p0));  // the steps moved it
  // Bad ranges are refused before anything changes (the step count included).
  const auto before = whole.parameters.clone();
  std::int64_t step = 3;
  CHECK_THROWS_AS(flat_adamw_step(whole, {{50, 53}, {1, 2}}, step, o), std::invalid_argument);  // not sorted
  CHECK_THROWS_AS(flat_adamw_step(whole, {{100, 104}}, step, o), std::invalid_argument);        // past the end
  CHECK(step == 3);
  CHECK(torch::equal(whole.parameters, before));
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

TEST_CASE("one compute thread means one for LibTorch and one for the BLAS library it calls") {
  use_one_compute_thread();
  CHECK(torch::get_num_threads() == 1);
  // Debian's LibTorch calls OpenBLAS (scripts/install-deps.sh installs it), whose own thread pool
  // torch::set_num_threads does not reach: every matrix product used to run on every core.
  const auto blas = blas_threads();
  if (blas) CHECK(*blas == 1);
  else MESSAGE("the BLAS library in use is not OpenBLAS: it does not report its threads");
}
