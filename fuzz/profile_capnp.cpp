// libFuzzer target: profile Cap'n Proto bytes (messages::profile_from_capnp). Every input either
// decodes to a valid profile that survives profile_to_capnp -> profile_from_capnp unchanged, or is
// refused with input_error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "messages/input_error.hpp"
#include "messages/profile_capnp.hpp"
#include "messages/profile_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace oobleck;
  planning::profile p;
  try {
    p = messages::profile_from_capnp(std::as_bytes(std::span(data, size)));
  } catch (const messages::input_error&) {
    return 0;
  }
  const auto q = messages::profile_from_capnp(messages::profile_to_capnp(p));
  const std::string a = messages::profile_json_text(p, -1), b = messages::profile_json_text(q, -1);
  if (a != b) {
    std::fprintf(stderr, "profile Cap'n Proto does not round-trip:\n%s\n%s\n", a.c_str(), b.c_str());
    std::abort();
  }
  return 0;
}
