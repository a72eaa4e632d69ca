#include "runtime/evaluate.hpp"

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::runtime {

double evaluate(layer_store& store, const token_dataset& data, std::int64_t windows, std::int64_t batch) {
  if (windows < 1) throw std::invalid_argument("evaluation needs at least one window, got " + std::to_string(windows));
  if (batch < 1) throw std::invalid_argument("evaluation batch must be >= 1, got " + std::to_string(batch));
  if (windows > data.size())
    throw std::invalid_argument("evaluation over " + std::to_string(windows) + " windows of " +
                                std::to_string(data.seq_len()) + " tokens: the data holds only " +
                                std::to_string(data.size()));
  const int layers = store.model().num_layers();
  std::vector<bool> was_training;
  for (int l = 0; l < layers; ++l) {
    was_training.push_back(store.module(l).is_training());
    store.module(l).eval();
  }
  torch::NoGradGuard no_grad;
  double sum = 0;  // of the windows' mean losses
  try {
    for (std::int64_t first = 0; first < windows; first += batch) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(std::min(batch, windows - first)));
      std::iota(ids.begin(), ids.end(), first);
      auto [x, targets] = data.batch(ids);
      x = x.to(store.device());
      {
        const autocast_scope precision(store.model().precision, store.device());
        for (int l = 0; l < layers; ++l) x = store.module(l).forward(x, nullptr);
      }
      // Per window: the mean over its T tokens; the windows' means summed in double.
      const auto per_token = torch::nn::functional::cross_entropy(
          x.reshape({-1, x.size(-1)}).to(torch::kCPU, torch::kFloat32), targets.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
      const auto per_window = per_token.reshape({static_cast<std::int64_t>(ids.size()), -1}).to(torch::kFloat64).mean(1);
      sum += per_window.sum().item<double>();
    }
  } catch (...) {
    for (int l = 0; l < layers; ++l) store.module(l).train(was_training[static_cast<std::size_t>(l)]);
    throw;
  }
  for (int l = 0; l < layers; ++l) store.module(l).train(was_training[static_cast<std::size_t>(l)]);
  return sum / static_cast<double>(windows);
}

}  // namespace oobleck::runtime
