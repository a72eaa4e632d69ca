// A device as a flag names it (runtime/device_spec.hpp), without LibTorch.
#include <doctest/doctest.h>

#include <stdexcept>

#include "runtime/device_spec.hpp"

using namespace oobleck::runtime;

TEST_CASE("device_spec: cpu, cuda and cuda:N, anything else refused with the accepted forms") {
  CHECK(parse_device_spec("cpu") == device_spec{"cpu", 0});
  CHECK(parse_device_spec("cuda") == device_spec{"cuda", 0});
  CHECK(parse_device_spec("cuda:3") == device_spec{"cuda", 3});
  CHECK(to_string(parse_device_spec("cuda:3")) == "cuda:3");
  CHECK(to_string(parse_device_spec("cpu")) == "cpu");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "CUDA", "cpu:0", "cuda:99999"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_device_spec(bad), doctest::Contains("is not one of cpu, cuda, cuda:N"),
                         std::invalid_argument);
  }
#ifdef OOBLECK_WITH_CUDA
  CHECK(built_with_cuda());
#else
  CHECK_FALSE(built_with_cuda());
#endif
}
