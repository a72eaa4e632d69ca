#include "planning/profile.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace oobleck::planning;

namespace {

// Two layers on nodes of 2 GPUs (the JSON form and its decoder are tested in tests/messages).
profile toy() {
  profile p;
  p.model = "toy";
  p.microbatch_size = 2;
  p.gpus_per_node = 2;
  p.device_memory_bytes = 1000000;
  p.layers = {{"embed", {1.5, 1.0}, {3, 2}, 4096, 512}, {"block0", {1, 0.5}, {2, 1.25}, 8192, 1024}};
  return p;
}

std::string error_of(const profile& p) {
  try {
    validate(p);
  } catch (const planning_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("stage widths are the powers of two up to M, without overflow at 2^30") {
  CHECK(stage_widths(1) == std::vector<int>{1});
  CHECK(stage_widths(4) == std::vector<int>{1, 2, 4});
  CHECK(stage_widths(1 << 30).size() == 31);  // a doubling int overflowed here and looped forever
  CHECK(width_index(4) == 2);
}

TEST_CASE("inconsistent profiles are refused with the reason") {
  CHECK(error_of(toy()).empty());
  auto p = toy();
  p.gpus_per_node = 3;
  CHECK(error_of(p).find("power of two") != std::string::npos);
  p = toy();
  p.layers[0].forward_ms.pop_back();
  CHECK(error_of(p).find("forward times for 1 stage widths, expected 2") != std::string::npos);
  p = toy();
  p.layers[0].forward_ms[0] = -1.5;
  CHECK(error_of(p).find("must be finite and >= 0") != std::string::npos);
  p = toy();
  p.microbatch_size = 0;
  CHECK(error_of(p).find("microbatch_size") != std::string::npos);
  p = toy();
  p.layers.clear();
  CHECK(error_of(p).find("no layers") != std::string::npos);
}

TEST_CASE("non-finite times from code are refused") {
  profile p = toy();
  p.layers[0].backward_ms[1] = std::nan("");
  CHECK_THROWS_AS(validate(p), planning_error);
}

TEST_CASE("a profile measured for another job is refused as stale") {
  const profile p = toy();
  CHECK_NOTHROW(check_matches(p, {.microbatch_size = 2, .gpus_per_node = 2}));
  try {
    check_matches(p, {.microbatch_size = 4});
    FAIL("expected a stale-profile error");
  } catch (const planning_error& e) {
    CHECK(std::string(e.what()).find("microbatch_size = 2, the job uses 4") != std::string::npos);
  }
  CHECK_THROWS_AS(check_matches(p, {.gpus_per_node = 8}), planning_error);
  CHECK_THROWS_AS(check_matches(p, {.config_hash = std::string("other")}), planning_error);
}
