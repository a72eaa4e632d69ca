// libFuzzer target: profile JSON (messages::profile_from_json). Every input either decodes to a
// valid profile that survives profile_json_text -> profile_from_json unchanged, or is refused with
// input_error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "messages/input_error.hpp"
#include "messages/profile_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace oobleck;
  planning::profile p;
  try {
    p = messages::profile_from_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const messages::input_error&) {
    return 0;
  }
  const std::string text = messages::profile_json_text(p, -1);
  const std::string again = messages::profile_json_text(messages::profile_from_json(text), -1);
  if (again != text) {
    std::fprintf(stderr, "profile JSON does not round-trip:\n%s\n%s\n", text.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
