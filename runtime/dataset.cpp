#include "runtime/dataset.hpp"

#include <array>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace oobleck::runtime {

token_dataset::token_dataset(std::string text, std::int64_t seq_len) : text_(std::move(text)), seq_len_(seq_len) {
  if (seq_len < 1) throw std::invalid_argument("sequence length must be >= 1");
  num_samples_ = (static_cast<std::int64_t>(text_.size()) - 1) / seq_len;
  if (num_samples_ < 1)
    throw std::runtime_error("the corpus has " + std::to_string(text_.size()) + " bytes, fewer than one sample of " +
                             std::to_string(seq_len + 1));
}

token_dataset token_dataset::from_file(const std::string& path, std::int64_t seq_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read corpus " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  try {
    return token_dataset(buf.str(), seq_len);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::pair<torch::Tensor, torch::Tensor> token_dataset::batch(const std::vector<std::int64_t>& ids) const {
  const auto n = static_cast<std::int64_t>(ids.size());
  auto input = torch::empty({n, seq_len_}, torch::kInt64);
  auto target = torch::empty({n, seq_len_}, torch::kInt64);
  auto in = input.accessor<std::int64_t, 2>();
  auto out = target.accessor<std::int64_t, 2>();
  for (std::int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0 || ids[r] >= num_samples_) throw std::out_of_range("sample id out of range");
    const auto base = ids[r] * seq_len_;
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      in[r][t] = static_cast<unsigned char>(text_[base + t]);
      out[r][t] = static_cast<unsigned char>(text_[base + t + 1]);
    }
  }
  return {input, target};
}

std::string default_corpus(std::size_t bytes, std::uint64_t seed) {
  static constexpr std::array<const char*, 12> subjects{"the pipeline", "a node",  "the coordinator", "every stage",
                                                        "the model",    "a layer", "the optimizer",   "each replica",
                                                        "the batch",    "a worker", "the template",   "the network"};
  static constexpr std::array<const char*, 10> verbs{"copies", "trains", "reduces", "sends", "recovers",
                                                     "plans",  "loses",  "joins",   "checks", "schedules"};
  static constexpr std::array<const char*, 10> objects{"the gradients", "its layers",   "a checkpoint", "the weights",
                                                       "one microbatch", "the samples", "a new epoch",  "the state",
                                                       "every failure", "the activations"};
  static constexpr std::array<const char*, 6> tails{" quickly", " again", " in order", " without a restart",
                                                    " at every step", ""};
  std::mt19937_64 rng(seed);
  std::string out;
  out.reserve(bytes + 80);
  while (out.size() < bytes) {
    std::string s = std::string(subjects[rng() % subjects.size()]) + " " + verbs[rng() % verbs.size()] + " " +
                    objects[rng() % objects.size()] + tails[rng() % tails.size()] + ". ";
    s[0] = static_cast<char>(s[0] - 'a' + 'A');
    out += s;
    if (rng() % 8 == 0) out += "\n";
  }
  out.resize(bytes);
  return out;
}

}  // namespace oobleck::runtime
