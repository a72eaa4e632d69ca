#include "runtime/dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace oobleck::runtime {

/// The token stream: owned bytes (a text) or a read-only mapping of a file; ids of `width` bytes,
/// little-endian.
struct token_dataset::storage {
  std::string owned;
  const unsigned char* bytes = nullptr;
  std::size_t size = 0;  ///< in bytes
  void* mapping = nullptr;
  int width = 1;

  storage() = default;
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (mapping) ::munmap(mapping, size);
  }
};

token_dataset::token_dataset(std::shared_ptr<const storage> s, std::int64_t seq_len, const std::string& origin)
    : data_(std::move(s)), seq_len_(seq_len) {
  if (seq_len < 1) throw std::invalid_argument("sequence length must be >= 1");
  tokens_ = static_cast<std::int64_t>(data_->size / static_cast<std::size_t>(data_->width));
  num_samples_ = windows_in(tokens_, seq_len);
  if (num_samples_ < 1)
    throw std::runtime_error(origin + "has " + std::to_string(tokens_) + (data_->width == 1 ? " bytes" : " tokens") +
                             ", fewer than one sample of " + std::to_string(seq_len + 1));
}

token_dataset::token_dataset(std::string text, std::int64_t seq_len)
    : token_dataset(
          [&] {
            auto s = std::make_shared<storage>();
            s->owned = std::move(text);
            s->bytes = reinterpret_cast<const unsigned char*>(s->owned.data());
            s->size = s->owned.size();
            return std::shared_ptr<const storage>(std::move(s));
          }(),
          seq_len, "the corpus ") {}

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

token_dataset token_dataset::from_tokens(const std::string& path, token_dtype dtype, std::int64_t seq_len,
                                         std::int64_t vocab) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot read token file " + path + ": " + std::strerror(errno));
  struct ::stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error("cannot read token file " + path + ": not a regular file");
  }
  auto s = std::make_shared<storage>();
  s->width = dtype_bytes(dtype);
  s->size = static_cast<std::size_t>(st.st_size);
  if (s->size % static_cast<std::size_t>(s->width) != 0) {
    ::close(fd);
    throw std::runtime_error(path + ": " + std::to_string(s->size) + " bytes is not a whole number of " +
                             dtype_name(dtype) + " token ids (" + std::to_string(s->width) + " bytes each)");
  }
  if (s->size > 0) {
    void* m = ::mmap(nullptr, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error("cannot map token file " + path + ": " + std::strerror(e));
    }
    s->mapping = m;
    s->bytes = static_cast<const unsigned char*>(m);
  }
  ::close(fd);  // the mapping stays valid
  token_dataset d(std::move(s), seq_len, path + ": ");
  // One pass over every id: a bad id found now names its place; found in a step it would be a
  // fault of that step, on some node, long after the start.
  for (std::int64_t i = 0; i < d.tokens_; ++i)
    if (d.id(i) >= vocab)
      throw std::runtime_error(path + ": token id " + std::to_string(d.id(i)) + " at byte offset " +
                               std::to_string(i * d.data_->width) + " is >= model vocab " + std::to_string(vocab));
  return d;
}

std::int64_t token_dataset::id(std::int64_t position) const {
  const unsigned char* p = data_->bytes + position * data_->width;
  switch (data_->width) {
    case 1: return p[0];
    case 2: return static_cast<std::int64_t>(p[0]) | static_cast<std::int64_t>(p[1]) << 8;
    default:
      return static_cast<std::int64_t>(p[0]) | static_cast<std::int64_t>(p[1]) << 8 |
             static_cast<std::int64_t>(p[2]) << 16 | static_cast<std::int64_t>(p[3]) << 24;
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
      in[r][t] = id(base + t);
      out[r][t] = id(base + t + 1);
    }
  }
  return {input, target};
}

token_dataset make_dataset(const data_source& source, std::int64_t seq_len, std::int64_t vocab) {
  if (source.byte_level() && vocab < 256)
    throw std::runtime_error("byte-level data (" + describe(source) + ") has token ids 0..255: model vocab " +
                             std::to_string(vocab) + " is too small");
  switch (source.kind) {
    case data_source::kind_t::generated:
      return token_dataset(default_corpus(static_cast<std::size_t>(source.corpus_bytes), source.corpus_seed), seq_len);
    case data_source::kind_t::text: return token_dataset::from_file(source.path, seq_len);
    case data_source::kind_t::tokens: return token_dataset::from_tokens(source.path, source.dtype, seq_len, vocab);
    case data_source::kind_t::none: break;
  }
  throw std::invalid_argument("no data source");
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
