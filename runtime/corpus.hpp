#pragma once
// The generated corpus alone, without LibTorch (runtime/dataset.hpp builds datasets from it): for
// programs and tests that only need its text. Defined in dataset.cpp (oobleck::runtime).

#include <cstddef>
#include <cstdint>
#include <string>

namespace oobleck::runtime {

/// A deterministic English-like corpus, so the main job and the tests need no download.
std::string default_corpus(std::size_t bytes = 1 << 20, std::uint64_t seed = 7);

}  // namespace oobleck::runtime
