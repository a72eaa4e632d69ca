// libFuzzer target: safetensors bytes (runtime::safetensors_file::parse, what [model] init,
// oobleck-eval --model and every reader of a Hugging Face folder read first). Every input either
// parses or is refused with safetensors_error; a parsed file's tensors tile its byte buffer, read
// as floats where their dtype allows, and survive encode_safetensors -> parse unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/safetensors.hpp"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "safetensors: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace oobleck::runtime;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  safetensors_file f;
  try {
    f = safetensors_file::parse(std::vector<std::byte>(bytes, bytes + size), "fuzz");
  } catch (const safetensors_error&) {
    return 0;
  }
  std::uint64_t at = 0;
  std::vector<std::vector<float>> values;
  std::vector<safetensors_tensor> again;
  for (const auto& e : f.tensors()) {
    if (e.begin != at) finding("a parsed file's tensors do not tile its buffer");
    at = e.end;
    if (f.bytes(e).size() != e.end - e.begin) finding("a tensor's bytes are not its offsets' span");
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16") {
      try {
        f.floats(e);
        finding("a tensor of another dtype was read as floats");
      } catch (const safetensors_error&) {
      }
      continue;
    }
    values.push_back(f.floats(e));
    if (static_cast<std::int64_t>(values.back().size()) != e.numel()) finding("floats() does not give numel values");
  }
  // The float tensors, written as F32 and parsed again, are the same values bitwise.
  std::size_t i = 0;
  for (const auto& e : f.tensors())
    if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") again.push_back({e.name, e.shape, values[i++]});
  const auto re = safetensors_file::parse(encode_safetensors(again, f.metadata()), "re-encoded");
  if (re.metadata() != f.metadata()) finding("metadata does not round-trip");
  i = 0;
  for (const auto& t : again) {
    const auto* e = re.find(t.name);
    if (!e || e->shape != t.shape) finding("a tensor's name or shape does not round-trip");
    const auto back = re.floats(*e);
    if (back.size() != t.values.size() ||
        (!back.empty() && std::memcmp(back.data(), t.values.data(), back.size() * sizeof(float)) != 0))
      finding("a tensor's values do not round-trip");
  }
  return 0;
}
