#pragma once
// Every benchmark's flags go through CLI11 with the apps' helpers (apps/flags.hpp: add_text,
// add_integer, add_number, parse_flags), so that each has --help and refuses an unknown flag or a
// bad value in the same words as the programs.
//
// This header does not include CLI11: its header (2.1.2, Debian's) defines validator objects that
// every file including it compiles again, ~12 s per file at -O3 on this project's 2-core machine,
// and each benchmark is its own program. The flags are compiled once, in bench_flags.cpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace oobleck::bench {

/// One flag of a flag_set: whether it was given, and how --help names its value.
class flag {
 public:
  explicit flag(CLI::Option* option) : option_(option) {}
  /// Whether the command line named it (at least once).
  bool given() const;
  /// The value's name in --help (INT, PATH, LIST, ...).
  flag& type_name(const std::string& name);

 private:
  CLI::Option* option_;
};

/// A benchmark's flags. parse() answers --help on stdout and a bad flag on stderr.
class flag_set {
 public:
  /// description: the first lines of --help; name: the program's name there.
  explicit flag_set(const std::string& description, const std::string& name = "");
  ~flag_set();
  flag_set(const flag_set&) = delete;
  flag_set& operator=(const flag_set&) = delete;

  /// A flag without a value: target becomes true when it is given.
  flag add_switch(const std::string& name, bool& target, const std::string& help);
  /// An integer in [min, max] (apps::add_integer's checks and words).
  flag add_integer(const std::string& name, std::int64_t min, std::int64_t max, std::function<void(std::int64_t)> set,
                   const std::string& help);
  template <class Int>
  flag add_integer(const std::string& name, Int& target, std::type_identity_t<Int> min, std::type_identity_t<Int> max,
                   const std::string& help) {
    return add_integer(name, min, max, [&target](std::int64_t x) { target = static_cast<Int>(x); }, help);
  }
  /// A finite number >= min.
  flag add_number(const std::string& name, double& target, double min, const std::string& help);
  /// A text (a path, a list).
  flag add_text(const std::string& name, std::string& target, const std::string& help);
  /// Exactly `count` words after the flag, left out of --help (a benchmark's own child processes).
  flag add_internal_words(const std::string& name, std::vector<std::string>& target, int count,
                          const std::string& help);

  /// Parses argv: an exit status for main when it should end now (0 after --help, printed on
  /// stdout; 2 after a bad flag, named on stderr), none when the benchmark should run.
  std::optional<int> parse(int argc, char** argv);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace oobleck::bench
