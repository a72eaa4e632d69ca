#include "runtime/device.hpp"

#include <dlfcn.h>

#include <stdexcept>

#include "runtime/cuda_info.hpp"

namespace oobleck::runtime {

void use_device_on_this_thread(const torch::Device& d) {
  if (!d.is_cuda()) return;
#ifdef OOBLECK_WITH_CUDA
  set_thread_cuda_device(d.has_index() ? d.index() : 0);
#endif
}

torch::Device make_device(device_kind kind, int index) {
  if (kind == device_kind::cpu) return torch::Device(torch::kCPU);
#ifndef OOBLECK_WITH_CUDA
  (void)index;
  throw std::runtime_error(no_cuda_build_reason());
#else
  if (!torch::cuda::is_available())
    throw std::runtime_error("CUDA was requested but LibTorch sees no GPU (is this LibTorch built with CUDA?)");
  if (index < 0 || index >= static_cast<int>(torch::cuda::device_count()))
    throw std::runtime_error("CUDA device " + std::to_string(index) + " does not exist (" +
                             std::to_string(torch::cuda::device_count()) + " visible)");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
#endif
}

torch::Device make_device(const device_spec& d) { return make_device(parse_device_kind(d.kind), d.index); }

std::string describe(const torch::Device& d) {
  if (d.is_cpu()) return "cpu";
  return "cuda:" + std::to_string(d.index());
}

device_kind parse_device_kind(const std::string& text) {
  if (text == "cpu") return device_kind::cpu;
  if (text == "cuda") return device_kind::cuda;
  throw std::invalid_argument("unknown device kind '" + text + "' (cpu or cuda)");
}

void use_one_compute_thread() {
  torch::set_num_threads(1);
  // Looked up at run time: the BLAS behind libblas.so.3 is whatever the system's alternatives
  // select, and only OpenBLAS has (and needs) this call.
  using set_threads = void (*)(int);
  if (auto* set = reinterpret_cast<set_threads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
}

std::optional<int> blas_threads() {
  using get_threads = int (*)();
  if (auto* get = reinterpret_cast<get_threads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) return get();
  return std::nullopt;
}

}  // namespace oobleck::runtime
