#pragma once
// Every benchmark's flags go through CLI11 with the apps' helpers (apps/flags.hpp: add_text,
// add_integer, add_number, parse_flags), so that each has --help and refuses an unknown flag or a
// bad value in the same words as the programs.

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "apps/flags.hpp"

namespace oobleck::bench {

using apps::add_integer;
using apps::add_number;
using apps::add_text;

/// Parses argv: an exit status for main when it should end now (0 after --help, printed on
/// stdout; 2 after a bad flag, named on stderr), none when the benchmark should run.
inline std::optional<int> parse_bench_flags(CLI::App& app, int argc, char** argv) {
  try {
    if (!apps::parse_flags(app, std::vector<std::string>(argv + 1, argv + argc), std::cout)) return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace oobleck::bench
