#pragma once
// Strict JSON decoding on nlohmann-json: what every JSON decoder of outside bytes builds on.
// Syntax errors, invalid UTF-8, duplicate keys, nesting deeper than max_depth, unknown keys and
// values of the wrong type are input_error, each naming the key path of the problem
// ("profile.layers[3].forward_ms: expected an object"). Numbers parse the same whatever the C
// locale (nlohmann's lexer does not depend on the decimal point of LC_NUMERIC).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "messages/input_error.hpp"

namespace oobleck::messages::json {

/// Deeper documents are refused: no format of ours nests beyond 4 levels.
inline constexpr int max_depth = 64;
/// So are documents of more values (a value costs 16 bytes or more once parsed, so a 64 MiB file
/// of "0," would otherwise take over 512 MiB); the largest profile has about 120,000.
inline constexpr std::size_t max_values = std::size_t{1} << 20;

/// Parses one document. `root` names it in errors ("profile"); a syntax error reads
/// "ROOT: JSON syntax error at line L column C: ...", a duplicate "PATH: duplicate key \"k\"",
/// and the caps "PATH: nesting deeper than 64 levels", "PATH: more than 1048576 values".
nlohmann::json parse_strict(std::string_view text, const std::string& root);

/// "a.b", or a["1"] when the key is not an identifier.
std::string member_path(const std::string& parent, std::string_view key);

/// A decoded value and its path; accessors throw input_error "PATH: expected ..." on a wrong type.
class node {
 public:
  node(const nlohmann::json& value, std::string path) : v_(&value), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  const nlohmann::json& value() const { return *v_; }

  [[noreturn]] void fail(const std::string& what) const;

  /// Requires an object whose keys are all in `known`; names the first unknown key.
  void expect_keys(std::initializer_list<std::string_view> known) const;
  /// Member of an object; "PATH: missing key \"k\"" when absent.
  node member(std::string_view key) const;
  std::optional<node> optional_member(std::string_view key) const;

  /// Elements of an array, in order.
  std::vector<node> elements() const;
  /// Members of an object, in key order.
  std::vector<std::pair<std::string, node>> members() const;

  std::string as_string() const;
  /// A JSON integer, or a number written as a float that is an exact integer below 2^53 (8.0, 8e9).
  std::int64_t as_integer() const;
  /// Any JSON number (finite: JSON cannot write NaN or infinity).
  double as_number() const;

 private:
  const nlohmann::json* v_;
  std::string path_;
};

}  // namespace oobleck::messages::json
