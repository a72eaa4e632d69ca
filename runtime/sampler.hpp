#pragma once
// Which samples form a step (ARCHITECTURE.md §5): a pure function of (seed, step, global batch), so no
// reconfiguration can skip or repeat a sample. No LibTorch here.

#include <cstdint>
#include <vector>

namespace oobleck::runtime {

class sampler {
 public:
  /// Draws from num_samples samples, one shuffled pass (epoch) after another.
  sampler(std::uint64_t seed, std::int64_t num_samples, std::int64_t global_batch);

  /// The global_batch sample ids of step k (0-based).
  std::vector<std::int64_t> step_samples(std::int64_t step) const;

  /// The ids pipeline i uses: its contiguous slice, given microbatch counts per pipeline.
  static std::vector<std::int64_t> slice(const std::vector<std::int64_t>& step_samples,
                                         const std::vector<int>& microbatches, int pipeline, int microbatch_size);

  /// Position `index` of the shuffled order of epoch `epoch`: a bijection on [0, num_samples).
  std::int64_t permuted(std::int64_t epoch, std::int64_t index) const;

 private:
  std::uint64_t seed_;
  std::int64_t num_samples_;
  std::int64_t global_batch_;
  int half_bits_;
};

}  // namespace oobleck::runtime
