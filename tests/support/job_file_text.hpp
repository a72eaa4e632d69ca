#pragma once
// What both job file suites use: a job text's error, a file's text, the source tree.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "apps/job_file.hpp"
#include "messages/input_error.hpp"

namespace oobleck::testing {

/// The error parse_job gives `text` (as "job.toml"), or "" when it parses.
inline std::string error_of(const std::string& text) {
  try {
    apps::parse_job(text, "job.toml");
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return "";
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline const std::filesystem::path kSource = OOBLECK_SOURCE_DIR;

}  // namespace oobleck::testing
