#include "apps/cli_args.hpp"

#include <charconv>
#include <cmath>
#include <limits>

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

namespace {

// std::from_chars reads the same under every C locale (std::stod took the decimal point from
// LC_NUMERIC, so "0.1" failed under de_DE); a leading '+' is accepted as before.
template <class T>
std::optional<T> parse_whole(const std::string& text) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+' && last - first > 1 && first[1] != '-') ++first;
  T x{};
  const auto [end, ec] = std::from_chars(first, last, x);
  if (ec != std::errc() || end != last) return std::nullopt;
  return x;
}

}  // namespace

std::optional<std::int64_t> parse_integer(const std::string& text) { return parse_whole<std::int64_t>(text); }

std::optional<double> parse_number(const std::string& text) {
  const auto x = parse_whole<double>(text);
  if (x && std::isfinite(*x)) return x;
  return std::nullopt;
}

std::int64_t cli_args::integer64(const std::string& flag, std::int64_t min) {
  const std::string v = value(flag);
  const auto x = parse_integer(v);
  if (!x) throw planning_error(flag + " expects an integer, got '" + v + "'");
  if (*x < min) throw planning_error(flag + " must be >= " + std::to_string(min) + ", got " + v);
  return *x;
}

int cli_args::integer(const std::string& flag, int min, int max) {
  const auto x = integer64(flag, min);
  if (x > max) throw planning_error(flag + " must be <= " + std::to_string(max) + ", got " + std::to_string(x));
  return static_cast<int>(x);
}

double cli_args::real(const std::string& flag, double min) {
  const std::string v = value(flag);
  const auto x = parse_number(v);
  if (!x) throw planning_error(flag + " expects a number, got '" + v + "'");
  if (*x < min) throw planning_error(flag + " must be >= " + std::to_string(min) + ", got " + v);
  return *x;
}

std::vector<int> cli_args::integer_list(const std::string& flag) {
  const std::string v = value(flag);
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= v.size()) {
    const auto comma = v.find(',', start);
    const std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto id = parse_integer(item);
    if (!id || *id < 0 || *id > std::numeric_limits<int>::max())
      throw planning_error(flag + " expects comma-separated node ids, got '" + v + "'");
    const int x = static_cast<int>(*id);
    out.push_back(x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace oobleck::apps
