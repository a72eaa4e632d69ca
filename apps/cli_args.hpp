#pragma once
// Command-line flags for the project's programs: "--flag value" or "--flag=value", with errors
// that name the flag (thrown as planning_error so every program reports them the same way).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oobleck::apps {

/// The whole of `text` as a base-10 integer / a finite number; nullopt otherwise.
std::optional<std::int64_t> parse_integer(const std::string& text);
std::optional<double> parse_number(const std::string& text);

class cli_args {
 public:
  explicit cli_args(std::vector<std::string> args) : args_(std::move(args)) {}

  bool wants_help() const;
  bool more() const { return i_ < args_.size(); }
  /// The next flag; a bare word is an error.
  std::string flag();
  std::string value(const std::string& flag);
  int integer(const std::string& flag, int min, int max);
  std::int64_t integer64(const std::string& flag, std::int64_t min);
  double real(const std::string& flag, double min);
  /// "3,7,9" -> {3, 7, 9}
  std::vector<int> integer_list(const std::string& flag);

 private:
  std::vector<std::string> args_;
  std::size_t i_ = 0;
  std::string pending_;  // value after '=' in --flag=value
  bool has_pending_ = false;
};

}  // namespace oobleck::apps
