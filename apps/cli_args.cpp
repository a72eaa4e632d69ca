#include "apps/cli_args.hpp"

#include <cmath>

#include "planning/profile.hpp"

namespace oobleck::apps {

using planning::planning_error;

bool cli_args::wants_help() const {
  for (const auto& a : args_)
    if (a == "--help" || a == "-h") return true;
  return false;
}

std::string cli_args::flag() {
  std::string f = args_[i_++];
  if (f.rfind("--", 0) != 0) throw planning_error("unexpected argument '" + f + "' (see --help)");
  if (const auto eq = f.find('='); eq != std::string::npos) {
    pending_ = f.substr(eq + 1);
    has_pending_ = true;
    f.resize(eq);
  }
  return f;
}

std::string cli_args::value(const std::string& flag) {
  if (has_pending_) {
    has_pending_ = false;
    return pending_;
  }
  if (i_ >= args_.size()) throw planning_error(flag + " needs a value");
  return args_[i_++];
}

std::int64_t cli_args::integer64(const std::string& flag, std::int64_t min) {
  const std::string v = value(flag);
  std::size_t used = 0;
  std::int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw planning_error(flag + " expects an integer, got '" + v + "'");
  if (x < min) throw planning_error(flag + " must be >= " + std::to_string(min) + ", got " + v);
  return x;
}

int cli_args::integer(const std::string& flag, int min, int max) {
  const auto x = integer64(flag, min);
  if (x > max) throw planning_error(flag + " must be <= " + std::to_string(max) + ", got " + std::to_string(x));
  return static_cast<int>(x);
}

double cli_args::real(const std::string& flag, double min) {
  const std::string v = value(flag);
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !std::isfinite(x)) throw planning_error(flag + " expects a number, got '" + v + "'");
  if (x < min) throw planning_error(flag + " must be >= " + std::to_string(min) + ", got " + v);
  return x;
}

std::vector<int> cli_args::integer_list(const std::string& flag) {
  const std::string v = value(flag);
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= v.size()) {
    const auto comma = v.find(',', start);
    const std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::size_t used = 0;
    int x = -1;
    try {
      x = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || x < 0)
      throw planning_error(flag + " expects comma-separated node ids, got '" + v + "'");
    out.push_back(x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace oobleck::apps
