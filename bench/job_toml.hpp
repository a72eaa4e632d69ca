#pragma once
// The benchmarks' one editor of job files: the text parsed as TOML (toml++), keys set in their
// sections, and the whole table written back (comments are not kept). The job decoder
// (apps::parse_job) then reads the result as it reads any job file.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace oobleck::bench {

/// A TOML value a benchmark sets: an integer, a boolean or a string.
using toml_value = std::variant<std::int64_t, bool, std::string>;

/// `key = value` in the table [section].
struct toml_key {
  std::string section, key;
  toml_value value;
};

/// The job text with every key set (replacing the key's value, or adding the key, and the
/// section when the text has none), in order. Throws std::invalid_argument for text that is not
/// TOML or a section name that holds something other than a table.
std::string with_keys(const std::string& job_text, const std::vector<toml_key>& keys);

}  // namespace oobleck::bench
