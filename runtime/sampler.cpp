#include "runtime/sampler.hpp"

#include <stdexcept>

namespace oobleck::runtime {

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

sampler::sampler(std::uint64_t seed, std::int64_t num_samples, std::int64_t global_batch)
    : seed_(seed), num_samples_(num_samples), global_batch_(global_batch) {
  if (num_samples < 1) throw std::invalid_argument("the dataset has no samples");
  if (global_batch < 1) throw std::invalid_argument("global batch must be >= 1");
  int bits = 1;
  while ((std::int64_t{1} << bits) < num_samples) ++bits;
  half_bits_ = (bits + 1) / 2;
}

// A 4-round Feistel network over 2 * half_bits bits is a bijection; cycle-walking restricts it to
// [0, num_samples). O(1) memory whatever the dataset size.
std::int64_t sampler::permuted(std::int64_t epoch, std::int64_t index) const {
  const std::uint64_t mask = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t x = static_cast<std::uint64_t>(index);
  do {
    std::uint64_t left = x >> half_bits_, right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t f = mix(seed_ ^ mix(static_cast<std::uint64_t>(epoch) * 4 + round) ^ right) & mask;
      const std::uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<std::uint64_t>(num_samples_));
  return static_cast<std::int64_t>(x);
}

std::vector<std::int64_t> sampler::step_samples(std::int64_t step) const {
  std::vector<std::int64_t> ids(global_batch_);
  for (std::int64_t j = 0; j < global_batch_; ++j) {
    const std::int64_t g = step * global_batch_ + j;
    ids[j] = permuted(g / num_samples_, g % num_samples_);
  }
  return ids;
}

std::vector<std::int64_t> sampler::slice(const std::vector<std::int64_t>& step_samples,
                                         const std::vector<int>& microbatches, int pipeline, int microbatch_size) {
  std::int64_t offset = 0;
  for (int i = 0; i < pipeline; ++i) offset += microbatches[i];
  const auto first = step_samples.begin() + offset * microbatch_size;
  return {first, first + static_cast<std::int64_t>(microbatches[pipeline]) * microbatch_size};
}

}  // namespace oobleck::runtime
