#pragma once
// The device seam: stage code asks for a device by kind and never hard-codes one.

#include <torch/torch.h>

#include <string>

namespace oobleck::runtime {

enum class device_kind { cpu, cuda };

/// The device `index` of that kind. CUDA needs a build with OOBLECK_WITH_CUDA=ON against a CUDA
/// LibTorch and a visible GPU; otherwise std::runtime_error says which is missing.
torch::Device make_device(device_kind kind, int index = 0);

/// "cpu" or "cuda:<name>", the device kind a profile records.
std::string describe(const torch::Device& d);

/// "cpu" / "cuda" (case-sensitive); throws std::invalid_argument otherwise.
device_kind parse_device_kind(const std::string& text);

}  // namespace oobleck::runtime
