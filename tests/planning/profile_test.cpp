#include "planning/profile.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "planning/json.hpp"
#include "planning/profile_json.hpp"

using namespace oobleck::planning;

namespace {

const char* kGood = R"({
  "model": "toy", "microbatch_size": 2, "gpus_per_node": 2, "device_memory_bytes": 1000000,
  "layers": [
    {"name": "embed", "forward_ms": {"1": 1.5, "2": 1.0}, "backward_ms": {"1": 3, "2": 2},
     "param_bytes": 4096, "activation_bytes": 512},
    {"name": "block0", "forward_ms": {"2": 0.5, "1": 1}, "backward_ms": {"1": 2, "2": 1.25},
     "param_bytes": 8192, "activation_bytes": 1024}
  ]
})";

std::string error_of(const std::string& text) {
  try {
    profile_from_json(text);
  } catch (const planning_error& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("a valid profile parses with widths in order") {
  const profile p = profile_from_json(kGood);
  CHECK(p.model == "toy");
  CHECK(p.microbatch_size == 2);
  CHECK(p.gpus_per_node == 2);
  REQUIRE(p.layers.size() == 2);
  CHECK(p.layers[1].forward_ms == std::vector<double>{1, 0.5});
  CHECK(p.layers[1].backward_ms == std::vector<double>{2, 1.25});
  CHECK(p.layers[0].param_bytes == 4096);
}

TEST_CASE("profile JSON round-trips") {
  profile p = profile_from_json(kGood);
  p.config_hash = "abc123";
  p.device_kind = "cpu";
  const profile q = profile_from_json(json::dump(profile_to_json(p), 2));
  CHECK(json::dump(profile_to_json(q)) == json::dump(profile_to_json(p)));
  CHECK(q.config_hash == "abc123");
  CHECK(q.layers[0].forward_ms == p.layers[0].forward_ms);
}

TEST_CASE("malformed JSON names the line and column") {
  const auto e = error_of("{\n  \"model\": \"x\",\n  \"layers\": [1, 2,]\n}");
  CHECK(e.find("JSON syntax error at line 3") != std::string::npos);
  CHECK(error_of("{\"model\": \"x\"").find("JSON syntax error") != std::string::npos);
  CHECK(error_of("").find("unexpected end of input") != std::string::npos);
}

TEST_CASE("unknown keys are rejected by name, at both levels") {
  CHECK(error_of(replace(kGood, "\"model\"", "\"modle\"")).find("unknown key \"modle\"") != std::string::npos);
  CHECK(error_of(replace(kGood, "\"forward_ms\": {\"1\": 1.5", "\"foward_ms\": {\"1\": 1.5"))
            .find("unknown key \"foward_ms\" in layer 0") != std::string::npos);
}

TEST_CASE("inconsistent profiles are refused with the reason") {
  CHECK(error_of(replace(kGood, "\"gpus_per_node\": 2", "\"gpus_per_node\": 3")).find("power of two") !=
        std::string::npos);
  CHECK(error_of(replace(kGood, ", \"2\": 1.0}", "}")).find("missing width \"2\"") != std::string::npos);
  CHECK(error_of(replace(kGood, "\"1\": 1.5", "\"1\": -1.5")).find("must be finite and >= 0") !=
        std::string::npos);
  CHECK(error_of(replace(kGood, "\"1\": 1.5", "\"4\": 1.5")).find("width key \"4\"") != std::string::npos);
  CHECK(error_of(replace(kGood, "\"param_bytes\": 4096", "\"param_bytes\": \"big\""))
            .find("must be an integer") != std::string::npos);
  CHECK(error_of(replace(kGood, "\"microbatch_size\": 2", "\"microbatch_size\": 0")).find("microbatch_size") !=
        std::string::npos);
  CHECK(error_of(replace(kGood, "\"model\": \"toy\", ", "")).find("missing key \"model\"") != std::string::npos);
  CHECK(error_of(R"({"model": "x", "microbatch_size": 1, "gpus_per_node": 1, "device_memory_bytes": 5,
                     "layers": []})")
            .find("no layers") != std::string::npos);
}

TEST_CASE("NaN cannot be written in JSON, and non-finite values from code are refused") {
  profile p = profile_from_json(kGood);
  p.layers[0].backward_ms[1] = std::nan("");
  CHECK_THROWS_AS(validate(p), planning_error);
}

TEST_CASE("a profile measured for another job is refused as stale") {
  const profile p = profile_from_json(kGood);
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
