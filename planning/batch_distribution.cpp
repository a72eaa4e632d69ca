#include "planning/batch_distribution.hpp"

#include <algorithm>
#include <queue>
#include <string>

#include "planning/profile.hpp"

namespace oobleck::planning {

int microbatches_per_step(int global_batch, int microbatch) {
  if (microbatch <= 0) throw planning_error("microbatch size must be >= 1, got " + std::to_string(microbatch));
  if (global_batch <= 0) throw planning_error("global batch must be >= 1, got " + std::to_string(global_batch));
  if (global_batch % microbatch != 0) {
    const int below = global_batch / microbatch * microbatch;
    const int above = below + microbatch;
    std::string rec = below > 0 ? std::to_string(below) + " or " + std::to_string(above) : std::to_string(above);
    throw planning_error("global batch " + std::to_string(global_batch) + " is not a multiple of the microbatch " +
                         std::to_string(microbatch) + "; nearest distributable global batch: " + rec);
  }
  return global_batch / microbatch;
}

batch_distribution distribute_batch(std::span<const pipeline_time> pipelines, int num_microbatches,
                                    int microbatch_size) {
  const int p = static_cast<int>(pipelines.size());
  if (p == 0) throw planning_error("no pipelines to distribute the batch over");
  if (num_microbatches < p)
    throw planning_error("global batch " + std::to_string(num_microbatches * microbatch_size) + " gives " +
                         std::to_string(num_microbatches) + " microbatches for " + std::to_string(p) +
                         " pipelines (each needs at least one); nearest distributable global batch: " +
                         std::to_string(p * microbatch_size));
  batch_distribution out;
  out.microbatches.assign(p, 1);
  using entry = std::pair<double, int>;  // (time after one more microbatch, pipeline)
  auto later = [](const entry& a, const entry& b) { return a.first != b.first ? a.first > b.first : a.second > b.second; };
  std::priority_queue<entry, std::vector<entry>, decltype(later)> next(later);
  for (int i = 0; i < p; ++i) next.emplace(pipelines[i].at(2), i);
  for (int left = num_microbatches - p; left > 0; --left) {
    const int i = next.top().second;
    next.pop();
    ++out.microbatches[i];
    next.emplace(pipelines[i].at(out.microbatches[i] + 1), i);
  }
  out.time_ms.resize(p);
  for (int i = 0; i < p; ++i) {
    out.time_ms[i] = pipelines[i].at(out.microbatches[i]);
    out.step_ms = std::max(out.step_ms, out.time_ms[i]);
  }
  return out;
}

}  // namespace oobleck::planning
