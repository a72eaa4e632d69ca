#pragma once
// The job file's keys (apps/job_schema.cpp): every key's type and bounds, and a decoder that names
// the file and line of what is wrong. Private to the job file's reader (apps/job_file.cpp), which
// applies the schema and then the rules that tie keys together.

#include <toml++/toml.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include "apps/job_file.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps::job_file_detail {

using messages::input_error;

inline constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline std::string format(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

/// A range of numbers, each end open or closed; infinite ends are not printed.
struct range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string describe() const {
    if (hi == kInf) return std::string(lo_open ? "> " : ">= ") + format(lo);
    if (lo == -kInf) return std::string(hi_open ? "< " : "<= ") + format(hi);
    return std::string("in ") + (lo_open ? "(" : "[") + format(lo) + ", " + format(hi) + (hi_open ? ")" : "]");
  }
};

class decoder {
 public:
  decoder(std::string_view origin, const toml::table& root) : origin_(origin), root_(root) {}

  [[noreturn]] void fail(const toml::node& at, const std::string& what) const {
    throw input_error(origin_ + ":" + std::to_string(at.source().begin.line) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { throw input_error(origin_ + ": " + what); }

  /// A rule across keys: at the line of the first of `keys` that the file sets.
  [[noreturn]] void fail_rule(std::initializer_list<const char*> keys, const std::string& what) const {
    for (const char* key : keys)
      if (const toml::node* at = root_.at_path(key).node()) fail(*at, what);
    fail(what);
  }

  std::int64_t integer(const toml::node& v, const std::string& key, std::int64_t min, std::int64_t max,
                       const std::string& why = "") const {
    const auto* x = v.as_integer();
    if (!x) fail(v, key + ": expected an integer, got " + type_of(v));
    if (x->get() < min) fail(v, key + " must be >= " + std::to_string(min) + why + ", got " + std::to_string(x->get()));
    if (x->get() > max) fail(v, key + " must be <= " + std::to_string(max) + ", got " + std::to_string(x->get()));
    return x->get();
  }

  /// A float or an integer (TOML's `0` is an integer; a user writing lr = 1 means a number).
  double number(const toml::node& v, const std::string& key, const range& r = {}) const {
    double x = 0;
    if (const auto* f = v.as_floating_point()) x = f->get();
    else if (const auto* i = v.as_integer()) x = static_cast<double>(i->get());
    else fail(v, key + ": expected a number, got " + type_of(v));
    if (!std::isfinite(x)) fail(v, key + " must be finite");
    if (!r.contains(x)) fail(v, key + " must be " + r.describe() + ", got " + format(x));
    return x;
  }

  const toml::table& root() const { return root_; }

  std::string text(const toml::node& v, const std::string& key) const {
    const auto* s = v.as_string();
    if (!s) fail(v, key + ": expected a string, got " + type_of(v));
    return s->get();
  }

 private:
  static std::string type_of(const toml::node& v) {
    std::ostringstream s;
    s << v.type();
    return s.str();
  }

  std::string origin_;
  const toml::table& root_;
};

using setter = std::function<void(const decoder&, const toml::node&, const std::string& key)>;

/// Every key of the schema, by its path: what reading its value does to `job`.
std::map<std::string, setter> schema(job_file& job);

}  // namespace oobleck::apps::job_file_detail
