// libFuzzer target: job files (apps::parse_job_file, a TOML subset). Every input either parses or
// is refused with the error the parser documents (planning::planning_error "NAME:LINE: ...").
#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/job_file.hpp"
#include "planning/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    oobleck::apps::parse_job_file(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  } catch (const oobleck::planning::planning_error&) {
  }
  return 0;
}
