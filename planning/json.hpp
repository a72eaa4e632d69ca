#pragma once
// A small JSON value, parser and writer: planning/ depends on the standard library only, and
// profiles and plans are the only JSON the project reads or writes.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "planning/profile.hpp"

namespace oobleck::planning::json {

class value;
using array = std::vector<value>;
/// Keys keep their input order, so output is stable and readable.
using object = std::vector<std::pair<std::string, value>>;

class value {
 public:
  value() = default;
  value(std::nullptr_t) {}
  value(bool b) : v_(b) {}
  value(int i) : v_(static_cast<std::int64_t>(i)) {}
  value(std::int64_t i) : v_(i) {}
  value(double d) : v_(d) {}
  value(const char* s) : v_(std::string(s)) {}
  value(std::string s) : v_(std::move(s)) {}
  value(array a) : v_(std::make_shared<array>(std::move(a))) {}
  value(object o) : v_(std::make_shared<object>(std::move(o))) {}

  bool is_null() const { return std::holds_alternative<std::monostate>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_integer() const { return std::holds_alternative<std::int64_t>(v_); }
  bool is_number() const { return is_integer() || std::holds_alternative<double>(v_); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<object>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  std::int64_t as_integer() const { return std::get<std::int64_t>(v_); }
  double as_number() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const array& as_array() const { return *std::get<std::shared_ptr<array>>(v_); }
  const object& as_object() const { return *std::get<std::shared_ptr<object>>(v_); }

  /// Member lookup on an object; nullptr when absent or when this is not an object.
  const value* find(std::string_view key) const;

  /// "null", "boolean", "integer", "number", "string", "array" or "object".
  const char* type_name() const;

 private:
  std::variant<std::monostate, bool, std::int64_t, double, std::string, std::shared_ptr<array>,
               std::shared_ptr<object>>
      v_;
};

/// Parses one JSON document; throws planning_error "JSON syntax error at line L column C: ...".
value parse(std::string_view text);

/// Serialises; indent 0 gives one line. Non-finite numbers are written as null.
std::string dump(const value& v, int indent = 0);

}  // namespace oobleck::planning::json
