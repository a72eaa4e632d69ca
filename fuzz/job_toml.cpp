// libFuzzer target: job files (apps::parse_job, TOML through toml++). Every input either decodes
// or is refused with the error parse_job documents (messages::input_error "ORIGIN:LINE: ...");
// any other exception escapes and is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "apps/job_file.hpp"
#include "messages/input_error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    oobleck::apps::parse_job(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  } catch (const oobleck::messages::input_error&) {
  }
  return 0;
}
