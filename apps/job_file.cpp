#include "apps/job_file.hpp"

#include <toml++/toml.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "messages/input_error.hpp"

namespace oobleck::apps {

using messages::input_error;

namespace {

class decoder {
 public:
  explicit decoder(std::string_view origin) : origin_(origin) {}

  [[noreturn]] void fail(const toml::node& at, const std::string& what) const {
    throw input_error(origin_ + ":" + std::to_string(at.source().begin.line) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { throw input_error(origin_ + ": " + what); }

  std::int64_t integer(const toml::node& v, const std::string& key, std::int64_t min, std::int64_t max,
                       const std::string& why = "") const {
    const auto* x = v.as_integer();
    if (!x) fail(v, key + ": expected an integer, got " + type_of(v));
    if (x->get() < min) fail(v, key + " must be >= " + std::to_string(min) + why + ", got " + std::to_string(x->get()));
    if (x->get() > max) fail(v, key + " must be <= " + std::to_string(max) + ", got " + std::to_string(x->get()));
    return x->get();
  }

  double number(const toml::node& v, const std::string& key) const {
    double x = 0;
    if (const auto* f = v.as_floating_point()) x = f->get();
    else if (const auto* i = v.as_integer()) x = static_cast<double>(i->get());
    else fail(v, key + ": expected a number, got " + type_of(v));
    if (!std::isfinite(x)) fail(v, key + " must be finite");
    return x;
  }

 private:
  static std::string type_of(const toml::node& v) {
    std::ostringstream s;
    s << v.type();
    return s.str();
  }

  std::string origin_;
};

using setter = std::function<void(const decoder&, const toml::node&, const std::string& key)>;

/// Every key of the schema, by its path.
std::map<std::string, setter> schema(job_file& job) {
  constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
  auto int64_in = [](std::int64_t& target, std::int64_t min) {
    return [&target, min](const decoder& d, const toml::node& v, const std::string& key) {
      target = d.integer(v, key, min, std::numeric_limits<std::int64_t>::max());
    };
  };
  auto int_in = [](int& target, int min) {
    return [&target, min](const decoder& d, const toml::node& v, const std::string& key) {
      target = static_cast<int>(d.integer(v, key, min, INT_MAX));
    };
  };
  return {
      {"model.vocab",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         job.model.vocab = d.integer(v, key, kByteVocab, kMax64, " (the byte-level corpus has token ids 0..255)");
       }},
      {"model.d_model", int64_in(job.model.d_model, 1)},
      {"model.heads", int64_in(job.model.heads, 1)},
      {"model.blocks", int64_in(job.model.blocks, 1)},
      {"model.seq_len", int64_in(job.model.seq_len, 1)},
      {"model.dropout",
       [&](const decoder& d, const toml::node& v, const std::string& key) { job.model.dropout = d.number(v, key); }},
      {"model.seed",
       [&](const decoder& d, const toml::node& v, const std::string& key) {
         job.model.seed = static_cast<std::uint64_t>(d.integer(v, key, 0, kMax64));
       }},
      {"training.microbatch", int_in(job.microbatch, 1)},
      {"training.global_batch", int_in(job.global_batch, 1)},
      {"cluster.device_memory_bytes", int64_in(job.device_memory_bytes, 1)},
      {"profile.warmup", int_in(job.profile_warmup, 0)},
      {"profile.repeats", int_in(job.profile_repeats, 1)},
  };
}

}  // namespace

job_file parse_job(std::string_view text, std::string_view origin) {
  const decoder d(origin);
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw input_error(std::string(origin) + ":" + std::to_string(e.source().begin.line) + ": " +
                      std::string(e.description()));
  }
  job_file job;
  const auto keys = schema(job);
  for (const auto& [section_key, section] : root) {
    const std::string name(section_key.str());
    const auto* table = section.as_table();
    if (!table) {
      const auto next = keys.lower_bound(name + ".");
      const bool is_section = next != keys.end() && next->first.rfind(name + ".", 0) == 0;
      d.fail(section, is_section ? name + ": expected a table [" + name + "]" : "unknown key " + name);
    }
    for (const auto& [key, value] : *table) {
      const std::string path = name + "." + std::string(key.str());
      const auto it = keys.find(path);
      if (it == keys.end()) d.fail(value, "unknown key " + path);
      it->second(d, value, path);
    }
  }
  try {
    runtime::validate(job.model);
  } catch (const std::invalid_argument& e) {
    d.fail(e.what());
  }
  if (job.global_batch % job.microbatch != 0)
    d.fail("training.global_batch " + std::to_string(job.global_batch) + " is not a multiple of training.microbatch " +
           std::to_string(job.microbatch));
  return job;
}

job_file read_job_file(const std::string& path) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw input_error("cannot read job file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  // fopen succeeds on a directory; reading it is the error.
  if (std::ferror(f.get())) throw input_error("cannot read job file " + path + ": " + std::strerror(errno));
  return parse_job(text, path);
}

}  // namespace oobleck::apps
