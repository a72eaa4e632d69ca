#pragma once
// A device as a flag names it ("cpu", "cuda", "cuda:1"), without LibTorch: the programs parse and
// check it before anything loads a model (runtime/device.hpp turns it into a torch::Device).

#include <string>

namespace oobleck::runtime {

struct device_spec {
  std::string kind = "cpu";  ///< "cpu" or "cuda"
  int index = 0;             ///< the GPU (cuda only)
  bool operator==(const device_spec&) const = default;
};

/// "cpu", "cuda" (GPU 0) or "cuda:N"; throws std::invalid_argument with the accepted forms.
device_spec parse_device_spec(const std::string& text);

/// "cpu" or "cuda:N".
std::string to_string(const device_spec& d);

/// Whether this build can compute on CUDA (configured with OOBLECK_WITH_CUDA=ON).
bool built_with_cuda();

/// Why a build without CUDA refuses a CUDA device, and how to get one that takes it.
std::string no_cuda_build_reason();

}  // namespace oobleck::runtime
