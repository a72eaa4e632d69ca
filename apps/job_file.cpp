#include "apps/job_file.hpp"

#include "apps/cli_args.hpp"

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "planning/profile.hpp"

namespace oobleck::apps {

using planning::planning_error;

namespace {

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

struct value {
  std::string text;
  int line;
};

}  // namespace

job_file parse_job_file(const std::string& text, const std::string& name) {
  job_file job;
  auto fail = [&](int line, const std::string& what) -> planning_error {
    return planning_error(name + ":" + std::to_string(line) + ": " + what);
  };
  auto integer = [&](const value& v, std::int64_t min) {
    const auto x = parse_integer(v.text);
    if (!x) throw fail(v.line, "expected an integer, got " + v.text);
    if (*x < min) throw fail(v.line, "must be >= " + std::to_string(min) + ", got " + v.text);
    return *x;
  };
  // For the int fields: 4294967296 must not narrow to 0 (a microbatch of 0 divided by zero below).
  auto integer32 = [&](const value& v, std::int64_t min) {
    const auto x = integer(v, min);
    if (x > std::numeric_limits<int>::max())
      throw fail(v.line, "must be <= " + std::to_string(std::numeric_limits<int>::max()) + ", got " + v.text);
    return static_cast<int>(x);
  };
  auto real = [&](const value& v) {
    const auto x = parse_number(v.text);
    if (!x) throw fail(v.line, "expected a number, got " + v.text);
    return *x;
  };
  using setter = std::function<void(const value&)>;
  const std::map<std::string, setter> keys{
      {"model.vocab", [&](const value& v) { job.model.vocab = integer(v, 2); }},
      {"model.d_model", [&](const value& v) { job.model.d_model = integer(v, 1); }},
      {"model.heads", [&](const value& v) { job.model.heads = integer(v, 1); }},
      {"model.blocks", [&](const value& v) { job.model.blocks = integer(v, 1); }},
      {"model.seq_len", [&](const value& v) { job.model.seq_len = integer(v, 1); }},
      {"model.dropout", [&](const value& v) { job.model.dropout = real(v); }},
      {"model.seed", [&](const value& v) { job.model.seed = static_cast<std::uint64_t>(integer(v, 0)); }},
      {"training.microbatch", [&](const value& v) { job.microbatch = integer32(v, 1); }},
      {"training.global_batch", [&](const value& v) { job.global_batch = integer32(v, 1); }},
      {"cluster.device_memory_bytes", [&](const value& v) { job.device_memory_bytes = integer(v, 1); }},
      {"profile.warmup", [&](const value& v) { job.profile_warmup = integer32(v, 0); }},
      {"profile.repeats", [&](const value& v) { job.profile_repeats = integer32(v, 1); }},
  };
  std::istringstream in(text);
  std::string raw, section;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    std::string s = raw;
    bool quoted = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '"') quoted = !quoted;
      if (s[i] == '#' && !quoted) {
        s.resize(i);
        break;
      }
    }
    s = trim(s);
    if (s.empty()) continue;
    if (s.front() == '[') {
      if (s.back() != ']') throw fail(line, "unterminated section header");
      section = trim(s.substr(1, s.size() - 2));
      continue;
    }
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw fail(line, "expected key = value");
    const std::string key = (section.empty() ? "" : section + ".") + trim(s.substr(0, eq));
    std::string v = trim(s.substr(eq + 1));
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    const auto it = keys.find(key);
    if (it == keys.end()) throw fail(line, "unknown key " + key);
    it->second({v, line});
  }
  try {
    runtime::validate(job.model);
  } catch (const std::invalid_argument& e) {
    throw planning_error(name + ": " + e.what());
  }
  if (job.global_batch % job.microbatch != 0)
    throw planning_error(name + ": training.global_batch " + std::to_string(job.global_batch) +
                         " is not a multiple of training.microbatch " + std::to_string(job.microbatch));
  return job;
}

job_file read_job_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw planning_error("cannot read job file " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  return parse_job_file(buf.str(), path);
}

}  // namespace oobleck::apps
