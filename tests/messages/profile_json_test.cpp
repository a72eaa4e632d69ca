#include "messages/profile_json.hpp"

#include <doctest/doctest.h>

#include <climits>
#include <string>

#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "support/comma_locale.hpp"

using namespace oobleck;
using messages::profile_from_json;

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

std::string profile_error_of(const std::string& text) {
  try {
    profile_from_json(text);
  } catch (const messages::input_error& e) {
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
  const auto p = profile_from_json(kGood);
  CHECK(p.model == "toy");
  CHECK(p.microbatch_size == 2);
  CHECK(p.gpus_per_node == 2);
  REQUIRE(p.layers.size() == 2);
  CHECK(p.layers[1].forward_ms == std::vector<double>{1, 0.5});
  CHECK(p.layers[1].backward_ms == std::vector<double>{2, 1.25});
  CHECK(p.layers[0].param_bytes == 4096);
}

TEST_CASE("profile JSON round-trips") {
  auto p = profile_from_json(kGood);
  p.config_hash = "abc123";
  p.device_kind = "cpu";
  const auto q = profile_from_json(messages::profile_json_text(p, 2));
  CHECK(messages::profile_json_text(q, -1) == messages::profile_json_text(p, -1));
  CHECK(q.config_hash == "abc123");
  CHECK(q.layers[0].forward_ms == p.layers[0].forward_ms);
}

TEST_CASE("the written form keeps the documented key order and layout") {
  const auto text = messages::profile_json_text(profile_from_json(kGood), -1);
  CHECK(text.rfind(R"({"model":"toy","microbatch_size":2,"gpus_per_node":2,"device_memory_bytes":1000000,)"
                   R"("layers":[{"name":"embed","forward_ms":{"1":1.5,"2":1.0},)",
                   0) == 0);
}

TEST_CASE("malformed JSON names the line and column") {
  CHECK(profile_error_of("{\n  \"model\": \"x\",\n  \"layers\": [1, 2,]\n}").find("profile: JSON syntax error at line 3") == 0);
  CHECK(profile_error_of("{\"model\": \"x\"").find("JSON syntax error") != std::string::npos);
  CHECK(profile_error_of("").find("unexpected end of input") != std::string::npos);
}

TEST_CASE("unknown and duplicate keys are refused by path, at both levels") {
  CHECK(profile_error_of(replace(kGood, "\"model\"", "\"modle\"")).find("profile: unknown key \"modle\"") == 0);
  CHECK(profile_error_of(replace(kGood, "\"forward_ms\": {\"1\": 1.5", "\"foward_ms\": {\"1\": 1.5"))
            .find("profile.layers[0]: unknown key \"foward_ms\"") == 0);
  CHECK(profile_error_of(replace(kGood, "\"model\": \"toy\",", "\"model\": \"toy\", \"model\": \"toy\",")) ==
        "profile.model: duplicate key \"model\"");
  CHECK(profile_error_of(replace(kGood, "{\"1\": 1.5, \"2\": 1.0}", "{\"1\": 1.5, \"2\": 1.0, \"1\": 7}")) ==
        R"(profile.layers[0].forward_ms["1"]: duplicate key "1")");
}

TEST_CASE("wrong types are refused with the key's path") {
  CHECK(profile_error_of(replace(kGood, "\"forward_ms\": {\"2\": 0.5, \"1\": 1}", "\"forward_ms\": 3")) ==
        "profile.layers[1].forward_ms: expected an object, got number");
  CHECK(profile_error_of(replace(kGood, "\"2\": 0.5", "\"2\": \"fast\"")) ==
        R"(profile.layers[1].forward_ms["2"]: expected a number, got string)");
  CHECK(profile_error_of(replace(kGood, "\"param_bytes\": 4096", "\"param_bytes\": \"big\"")) ==
        "profile.layers[0].param_bytes: expected an integer, got string");
  CHECK(profile_error_of(replace(kGood, "\"model\": \"toy\"", "\"model\": 7")) == "profile.model: expected a string, got number");
  CHECK(profile_error_of(replace(kGood, "\"model\": \"toy\", ", "")) == "profile: missing key \"model\"");
}

TEST_CASE("inconsistent profiles are refused with the reason") {
  CHECK(profile_error_of(replace(kGood, "\"gpus_per_node\": 2", "\"gpus_per_node\": 3")) ==
        "profile.gpus_per_node: 3 is not a power of two (1, 2, 4, ..., 1024)");
  CHECK(profile_error_of(replace(kGood, ", \"2\": 1.0}", "}")).find("profile.layers[0].forward_ms: missing width \"2\"") == 0);
  CHECK(profile_error_of(replace(kGood, "\"1\": 1.5", "\"1\": -1.5")).find("must be finite and >= 0") != std::string::npos);
  CHECK(profile_error_of(replace(kGood, "\"1\": 1.5", "\"4\": 1.5")).find(R"(profile.layers[0].forward_ms["4"]: not a stage width)") == 0);
  CHECK(profile_error_of(replace(kGood, "\"1\": 1.5", "\"01\": 1.5")).find("not a stage width") != std::string::npos);
  CHECK(profile_error_of(replace(kGood, "\"microbatch_size\": 2", "\"microbatch_size\": 0")) ==
        "profile.microbatch_size: 0, must be >= 1");
  CHECK(profile_error_of(R"({"model": "x", "microbatch_size": 1, "gpus_per_node": 1, "device_memory_bytes": 5,
                     "layers": []})") == "profile.layers: no layers");
}

TEST_CASE("caps name their limit") {
  CHECK(profile_error_of(replace(kGood, "\"gpus_per_node\": 2", "\"gpus_per_node\": 2048")) ==
        "profile.gpus_per_node: 2048 is above the limit of 1024 GPUs per node");
  CHECK(profile_error_of(replace(kGood, "\"param_bytes\": 4096", "\"param_bytes\": 281474976710657")) ==
        "profile.layers[0].param_bytes: 281474976710657 is above the limit of 281474976710656 bytes (256 TiB)");
  CHECK(profile_error_of(replace(kGood, "\"1\": 1.5", "\"1\": 2e9")).find("above the limit of 1e9 ms") != std::string::npos);
  std::string many = R"({"model": "x", "microbatch_size": 1, "gpus_per_node": 1, "device_memory_bytes": 5, "layers": [)";
  for (int i = 0; i < 4097; ++i)
    many += std::string(i ? "," : "") +
            R"({"name": "l", "forward_ms": {"1": 1}, "backward_ms": {"1": 1}, "param_bytes": 1, "activation_bytes": 1})";
  CHECK(profile_error_of(many + "]}") == "profile.layers: 4097 layers is above the limit of 4096 layers");
}

TEST_CASE("a microbatch size above INT_MAX is refused, not narrowed") {
  // 2^32 + 2 narrowed to int is 2, which the old decoder accepted as a valid microbatch size.
  CHECK(profile_error_of(replace(kGood, "\"microbatch_size\": 2", "\"microbatch_size\": 4294967298")) ==
        "profile.microbatch_size: 4294967298 is out of range (at most 2147483647)");
  CHECK(profile_error_of(replace(kGood, "\"microbatch_size\": 2", "\"microbatch_size\": 2147483648")).find("out of range") !=
        std::string::npos);
  CHECK(profile_from_json(replace(kGood, "\"microbatch_size\": 2", "\"microbatch_size\": 2147483647")).microbatch_size ==
        INT_MAX);
}

TEST_CASE("a profile reads the same under a comma-decimal C locale") {
  oobleck::test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  // The old decoder's strtod read 1.5 as 1 and 1.25 as 1 here.
  const auto p = profile_from_json(kGood);
  CHECK(p.layers[0].forward_ms[0] == 1.5);
  CHECK(p.layers[1].backward_ms[1] == 1.25);
  CHECK(messages::profile_json_text(p, -1).find("\"1\":1.5") != std::string::npos);
}

TEST_CASE("names decode to UTF-8, surrogate pairs included") {
  const auto p = profile_from_json(replace(kGood, "\"name\": \"embed\"", R"("name": "emb\ud83d\ude00")"));
  CHECK(p.layers[0].name == "emb\xF0\x9F\x98\x80");
  CHECK(profile_error_of(replace(kGood, "\"name\": \"embed\"", R"("name": "\ud83d")")).rfind("profile: JSON syntax error", 0) == 0);
  CHECK(profile_error_of(replace(kGood, "\"name\": \"embed\"", R"("name": "a\u0000b")")) ==
        "profile.layers[0].name: control character 0x00 at byte 1");
}
