// One pipeline of stages on threads over layer stores of their own (a node each): what the layer
// store's tests train, copy between and re-view (tests/runtime/layer_store*_test.cpp).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/layer_store.hpp"
#include "support/cluster_harness.hpp"

namespace oobleck::testing {

/// One pipeline of `ranges` stages on threads, one store per stage (a node each), all B/b
/// microbatches. view() starts a new epoch: new views over the same stores.
struct staged_pipeline {
  training_setup setup;
  std::vector<std::unique_ptr<runtime::layer_store>> stores;
  std::unique_ptr<fake_hub> hub;
  std::vector<std::unique_ptr<runtime::stage_executor>> views;

  staged_pipeline(training_setup s, const std::vector<std::pair<int, int>>& ranges) : setup(std::move(s)) {
    for (const auto& [u, v] : ranges) {
      stores.push_back(std::make_unique<runtime::layer_store>(setup.model));
      stores.back()->ensure(u, v);
    }
    view(ranges);
  }

  void view(const std::vector<std::pair<int, int>>& ranges) {
    views.clear();
    hub = std::make_unique<fake_hub>(static_cast<int>(ranges.size()));
    const runtime::executor_options options{.microbatch_size = setup.microbatch,
                                            .global_microbatches = setup.global_batch / setup.microbatch,
                                            .activation_checkpointing = setup.activation_checkpointing,
                                            .optimizer = setup.optimizer};
    const int S = static_cast<int>(ranges.size());
    for (int k = 0; k < S; ++k)
      views.push_back(std::make_unique<runtime::stage_executor>(
          *stores[k], runtime::stage_position{ranges[k].first, ranges[k].second, k, S, k - 1, k + 1}, hub->at(k),
          options));
  }

  /// Forward and backward of step k; returns the mean loss. Gradients stay until commit/discard.
  double run(std::int64_t k) {
    const auto& data = test_dataset(setup.model.seq_len);
    const runtime::sampler sampler(setup.data_seed, data.size(), setup.global_batch);
    const auto [in, out] = data.batch(sampler.step_samples(k));
    const int M = setup.global_batch / setup.microbatch;
    std::vector<double> loss(views.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < views.size(); ++r)
      threads.emplace_back([&, r] { loss[r] = views[r]->run_step(k, 0, M, in, out); });
    for (auto& t : threads) t.join();
    return loss.back() / M;
  }
  void train(std::int64_t from, std::int64_t to) {
    for (auto k = from; k < to; ++k) {
      run(k);
      for (auto& v : views) v->commit();
    }
  }
  /// Every layer's gradient buffer, in layer order.
  std::vector<torch::Tensor> gradients() {
    std::vector<torch::Tensor> out;
    for (auto& v : views)
      for (int l = v->position().first_layer; l < v->position().end_layer; ++l)
        out.push_back(stores[v->position().stage]->gradients(l).clone());
    return out;
  }
  void discard() {
    for (auto& v : views) v->discard();
  }
};

inline bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

inline double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  return max_relative_difference(std::vector<std::vector<torch::Tensor>>{a},
                                          std::vector<std::vector<torch::Tensor>>{b});
}

inline std::vector<torch::Tensor> moments(runtime::layer_store& s, int layer) {
  const auto& o = s.optimizer_state(layer);
  auto out = o.exp_avg;
  out.insert(out.end(), o.exp_avg_sq.begin(), o.exp_avg_sq.end());
  return out;
}

inline training_setup with_dropout(double p) {
  auto s = small_setup();
  s.model.dropout = p;
  return s;
}

}  // namespace oobleck::testing
