#pragma once
// Command-line flags through CLI11, with the checks its own conversions lack: an integer is the
// whole argument in base 10 (CLI11 reads "010" as octal and saturates a 64-bit overflow), one
// leading '+' allowed, and lies in its documented range; a number is finite and read the same
// under every C locale (std::from_chars). Errors name the flag (messages::input_error).
// Every flag takes "--flag value" or "--flag=value"; a flag given twice keeps its last value,
// except those the caller marks trigger_on_parse(), whose callback sees every occurrence in order.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/device_spec.hpp"

namespace oobleck::apps {

/// The value of a --device flag (cpu, cuda, cuda:N), refused with messages::input_error when it
/// is none of those or names CUDA in a build without it.
runtime::device_spec parse_device_flag(const std::string& text);

/// An integer flag in [min, max]; set receives each value.
CLI::Option* add_integer(CLI::App& app, const std::string& name, std::int64_t min, std::int64_t max,
                         std::function<void(std::int64_t)> set, const std::string& help);

template <class Int>
CLI::Option* add_integer(CLI::App& app, const std::string& name, Int& target, std::type_identity_t<Int> min,
                         std::type_identity_t<Int> max, const std::string& help) {
  return add_integer(app, name, min, max, [&target](std::int64_t x) { target = static_cast<Int>(x); }, help);
}

template <class Int>
CLI::Option* add_integer(CLI::App& app, const std::string& name, std::optional<Int>& target,
                         std::type_identity_t<Int> min, std::type_identity_t<Int> max, const std::string& help) {
  return add_integer(app, name, min, max, [&target](std::int64_t x) { target = static_cast<Int>(x); }, help);
}

/// A finite number >= min.
CLI::Option* add_number(CLI::App& app, const std::string& name, double& target, double min, const std::string& help);

/// A text flag (a path).
CLI::Option* add_text(CLI::App& app, const std::string& name, std::string& target, const std::string& help);

/// "3,7,9" -> {3, 7, 9}: node ids, each in [0, INT_MAX].
std::vector<int> parse_id_list(const std::string& flag, const std::string& text);

/// "STEP:SECONDS" -> (STEP, SECONDS): a step >= 0 and seconds > 0 (--hang-coordinator-at,
/// --hang-self-at); messages::input_error naming the flag otherwise.
std::pair<std::uint64_t, double> parse_step_seconds(const std::string& flag, const std::string& text);

/// Parses args (without the program name). Returns false when --help or -h is among them, after
/// writing the help text to out. Throws CLI::ParseError or messages::input_error on bad flags;
/// an unknown flag or a stray word is "unknown option --x" / "unexpected argument 'x'".
bool parse_flags(CLI::App& app, const std::vector<std::string>& args, std::ostream& out);

}  // namespace oobleck::apps
