// libFuzzer target: checkpoint manifest bytes (runtime::manifest_from_capnp, what --resume reads
// first). Every input either decodes to a manifest that survives manifest_to_capnp ->
// manifest_from_capnp unchanged, or is refused with checkpoint_error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "runtime/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace oobleck::runtime;
  checkpoint_manifest m;
  try {
    m = manifest_from_capnp(std::as_bytes(std::span(data, size)), "manifest");
  } catch (const checkpoint_error&) {
    return 0;
  }
  if (manifest_from_capnp(manifest_to_capnp(m), "re-encoded") != m) {
    std::fprintf(stderr, "a checkpoint manifest does not round-trip\n");
    std::abort();
  }
  return 0;
}
