#include "runtime/device_spec.hpp"

#include <charconv>
#include <stdexcept>

namespace oobleck::runtime {

device_spec parse_device_spec(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("device '" + text + "' is not one of cpu, cuda, cuda:N (N a GPU index)");
  };
  if (text == "cpu") return {};
  if (text == "cuda") return {"cuda", 0};
  const std::string prefix = "cuda:";
  if (text.rfind(prefix, 0) != 0 || text.size() == prefix.size()) throw bad();
  int index = -1;
  const char* first = text.data() + prefix.size();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, index);
  if (ec != std::errc{} || end != last || index < 0 || index > 1023) throw bad();
  return {"cuda", index};
}

std::string to_string(const device_spec& d) {
  return d.kind == "cpu" ? std::string("cpu") : d.kind + ":" + std::to_string(d.index);
}

std::string no_cuda_build_reason() {
  return "this build has no CUDA support (configure with -DOOBLECK_WITH_CUDA=ON against a CUDA LibTorch: "
         "scripts/gpu/build.sh)";
}

bool built_with_cuda() {
#ifdef OOBLECK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace oobleck::runtime
