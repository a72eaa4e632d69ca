#include "support/cluster_harness.hpp"

#include <cmath>
#include <future>
#include <map>

#include "support/deadline.hpp"
#include "support/torch_adamw.hpp"

namespace oobleck::testing {

training_setup small_setup() {
  training_setup s;
  s.model = {.vocab = 256, .d_model = 32, .heads = 4, .blocks = 4, .seq_len = 16, .dropout = 0.0, .seed = 5};
  s.optimizer.lr = {.peak = 3e-3, .warmup_steps = 2, .total_steps = 20, .min_lr = 3e-4};
  return s;
}

const runtime::token_dataset& test_dataset(std::int64_t seq_len) {
  static std::map<std::int64_t, runtime::token_dataset> cache;
  auto it = cache.find(seq_len);
  if (it == cache.end()) it = cache.emplace(seq_len, runtime::token_dataset(runtime::default_corpus(1 << 16), seq_len)).first;
  return it->second;
}

training_result train_reference(const training_setup& s) {
  const auto& data = test_dataset(s.model.seq_len);
  runtime::sampler sampler(s.data_seed, data.size(), s.global_batch);
  auto layers = runtime::build_layers(s.model, 0, s.model.num_layers());
  // LibTorch's AdamW, not the project's: the executors' optimizer is under test too.
  std::vector<torch::Tensor> params;
  for (auto& l : layers)
    for (auto& p : l->parameters()) params.push_back(p);
  auto optimizer = torch_adamw(params, s.optimizer);
  training_result r;
  for (int step = 0; step < s.steps; ++step) {
    auto [input, target] = data.batch(sampler.step_samples(step));
    if (s.model.dropout == 0) {
      torch::Tensor h = input;
      for (auto& l : layers) h = l->forward(h);
      auto loss = runtime::lm_loss(h, target);
      r.losses.push_back(loss.item<double>());
      loss.backward();
    } else {
      // Dropout masks belong to (step, global microbatch, layer): draw them microbatch by
      // microbatch, as any pipeline split does.
      const int M = s.global_batch / s.microbatch;
      double loss_sum = 0;
      for (int m = 0; m < M; ++m) {
        torch::Tensor h = input.slice(0, m * s.microbatch, (m + 1) * s.microbatch);
        for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
          auto gen = runtime::dropout_generator(s.model, step, m, l);
          h = layers[l]->forward(h, &gen);
        }
        auto loss = runtime::lm_loss(h, target.slice(0, m * s.microbatch, (m + 1) * s.microbatch));
        loss_sum += loss.item<double>();
        (loss / M).backward();
      }
      r.losses.push_back(loss_sum / M);
    }
    const bool tied = runtime::tied(s.model);
    auto head_copy = layers.back()->parameters()[0];
    if (tied) {
      auto embedding = layers.front()->parameters()[0].grad();
      embedding.add_(head_copy.grad());
      head_copy.grad().copy_(embedding);
    }
    if (step == 0)
      for (auto& l : layers) {
        std::vector<torch::Tensor> g;
        for (auto& p : l->parameters()) g.push_back(p.grad().clone());
        r.first_gradients.push_back(std::move(g));
      }
    // Clipped after the gradients are recorded: the executors scale them at commit.
    if (s.optimizer.clip_norm > 0) {
      std::vector<torch::Tensor> once;
      for (auto& l : layers)
        for (auto& p : l->parameters())
          if (!(tied && p.is_same(head_copy))) once.push_back(p);
      r.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(once, s.optimizer.clip_norm));
      if (tied) head_copy.grad().copy_(layers.front()->parameters()[0].grad());
    }
    set_learning_rate(*optimizer, s.optimizer.lr, step + 1);
    optimizer->step();
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
  }
  for (auto& l : layers) {
    r.parameters.push_back(l->parameters());
    r.digests.push_back({runtime::tensor_digest(l->parameters())});
  }
  if (runtime::tied(s.model))
    for (auto* l : {&layers.front(), &layers.back()}) r.tied_digests.push_back(runtime::tensor_digest({(*l)->parameters()[0]}));
  return r;
}

training_result train_pipelines(const training_setup& s, const std::vector<pipeline_shape>& pipelines) {
  const auto& data = test_dataset(s.model.seq_len);
  runtime::sampler sampler(s.data_seed, data.size(), s.global_batch);
  const int L = s.model.num_layers();
  // Ranks in pipeline order; layer_groups[l] = the rank holding l in each pipeline.
  std::vector<placed_stage> ranks;
  std::vector<std::vector<int>> layer_groups(L);
  for (int p = 0; p < static_cast<int>(pipelines.size()); ++p) {
    const int base = static_cast<int>(ranks.size());
    const int stages = static_cast<int>(pipelines[p].stages.size());
    for (int k = 0; k < stages; ++k) {
      const auto [u, v] = pipelines[p].stages[k];
      ranks.push_back({p, {u, v, k, stages, base + k - 1, base + k + 1, base, base + stages - 1}});
      for (int l = u; l < v; ++l) layer_groups[l].push_back(base + k);
    }
  }
  fake_hub hub(static_cast<int>(ranks.size()));
  runtime::executor_options options{.microbatch_size = s.microbatch,
                                    .global_microbatches = s.global_batch / s.microbatch,
                                    .activation_checkpointing = s.activation_checkpointing,
                                    .optimizer = s.optimizer};
  // One store per rank, as one node per stage; the executors are views over them.
  std::vector<std::unique_ptr<runtime::layer_store>> stores;
  std::vector<std::unique_ptr<runtime::stage_executor>> executors;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    stores.push_back(std::make_unique<runtime::layer_store>(s.model));
    stores.back()->ensure(ranks[r].position.first_layer, ranks[r].position.end_layer);
    executors.push_back(std::make_unique<runtime::stage_executor>(*stores[r], ranks[r].position, hub.at(r), options));
  }
  std::vector<int> microbatches, first_microbatch;
  for (const auto& p : pipelines) {
    first_microbatch.push_back(microbatches.empty() ? 0 : first_microbatch.back() + microbatches.back());
    microbatches.push_back(p.microbatches);
  }
  training_result result;
  result.first_gradients.resize(L);
  for (int step = 0; step < s.steps; ++step) {
    const auto ids = sampler.step_samples(step);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
    for (int p = 0; p < static_cast<int>(pipelines.size()); ++p)
      batches.push_back(data.batch(runtime::sampler::slice(ids, microbatches, p, s.microbatch)));
    std::vector<double> loss(ranks.size(), 0.0), grad_sq(ranks.size(), 0.0);
    std::vector<std::future<void>> stages;
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
      stages.push_back(std::async(std::launch::async, [&, r] {
        const int p = ranks[r].pipeline;
        loss[r] = executors[r]->run_step(step, first_microbatch[p], pipelines[p].microbatches, batches[p].first,
                                         batches[p].second);
        executors[r]->reduce_gradients(layer_groups);
        if (step == 0)
          for (int l = ranks[r].position.first_layer; l < ranks[r].position.end_layer; ++l)
            if (layer_groups[l].front() == r)
              for (auto& p : executors[r]->parameters(l)) result.first_gradients[l].push_back(p.grad().clone());
        if (s.optimizer.clip_norm > 0) grad_sq[r] = executors[r]->gradient_sq_norm();
      }));
    // A step of this size takes well under a second; a stage still running after 30 s is stuck
    // (a lost message, a collective that never completes): fail, abort the hub to free it.
    wait_or_fail(stages, std::chrono::seconds(30), "step " + std::to_string(step) + " of a stage",
                 [&] { hub.abort_all(); });
    for (auto& f : stages) f.get();  // rethrows a stage's error
    // The coordinator's part: pipeline 0's stages add up the squared norm, one factor for all.
    double scale = 1;
    if (s.optimizer.clip_norm > 0) {
      double sq = 0;
      for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
        if (ranks[r].pipeline == 0) sq += grad_sq[r];
      result.grad_norms.push_back(std::sqrt(sq));
      scale = runtime::clip_scale(s.optimizer.clip_norm, std::sqrt(sq));
    }
    for (auto& e : executors) e->commit(scale);
    double total = 0;
    for (double l : loss) total += l;
    result.losses.push_back(total / (s.global_batch / s.microbatch));
  }
  result.parameters.resize(L);
  result.digests.resize(L);
  for (int l = 0; l < L; ++l)
    for (int g : layer_groups[l]) {
      if (result.parameters[l].empty()) result.parameters[l] = executors[g]->parameters(l);
      result.digests[l].push_back(executors[g]->parameter_digest(l));
      if (runtime::tied(s.model) && (l == 0 || l == L - 1))
        result.tied_digests.push_back(runtime::tensor_digest({executors[g]->parameters(l)[0]}));
    }
  return result;
}

double max_relative_difference(const std::vector<std::vector<torch::Tensor>>& a,
                               const std::vector<std::vector<torch::Tensor>>& b) {
  double worst = 0;
  for (std::size_t l = 0; l < a.size(); ++l)
    for (std::size_t i = 0; i < a[l].size(); ++i) {
      const auto& x = a[l][i];
      const auto& y = b[l][i];
      worst = std::max(worst, (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30));
    }
  return worst;
}

double max_elementwise_difference(const training_result& a, const training_result& b) {
  double worst = 0;
  for (std::size_t l = 0; l < a.parameters.size(); ++l)
    for (std::size_t i = 0; i < a.parameters[l].size(); ++i) {
      const auto& x = a.parameters[l][i];
      const auto& y = b.parameters[l][i];
      worst = std::max(worst, (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-30));
    }
  return worst;
}

}  // namespace oobleck::testing
