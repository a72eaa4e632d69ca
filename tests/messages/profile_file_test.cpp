#include "messages/profile_file.hpp"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <limits>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "messages/input_error.hpp"
#include "messages/profile.capnp.h"
#include "messages/profile_capnp.hpp"
#include "messages/profile_json.hpp"
#include "planning/synthetic_profile.hpp"

using namespace oobleck;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/oobleck-test-" + std::to_string(::getpid()) + "-" + name;
}

std::string error_reading(const std::string& path) {
  try {
    messages::read_profile_file(path);
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return "";
}

std::string error_decoding(std::span<const std::byte> bytes) {
  try {
    messages::decode_profile(bytes);
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return "";
}

std::string json_of(const planning::profile& p) { return messages::profile_json_text(p, -1); }

// A Cap'n Proto profile with every field set by `edit`, as oobleck-profile would write it, but
// with values no planning::profile can hold.
template <class Edit>
std::vector<std::byte> capnp_bytes(Edit edit) {
  const auto p = planning::synthetic_gpt_profile({.layers = 3, .gpus_per_node = 2});
  const auto good = messages::profile_to_capnp(p);
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(good.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), good.data(), good.size());
  capnp::FlatArrayMessageReader reader(words);
  capnp::MallocMessageBuilder builder;
  builder.setRoot(reader.getRoot<messages::schema::Profile>());
  edit(builder.getRoot<messages::schema::Profile>());
  const auto flat = capnp::messageToFlatArray(builder);
  const auto bytes = flat.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

}  // namespace

TEST_CASE("a profile survives the Cap'n Proto file round trip exactly") {
  auto p = planning::synthetic_gpt_profile({.layers = 6, .gpus_per_node = 4});
  p.config_hash = "cfg-1234";
  const auto path = temp_path("profile.bin");
  messages::write_profile_capnp(p, path);
  const auto q = messages::read_profile_file(path);
  std::remove(path.c_str());
  CHECK(json_of(q) == json_of(p));
  CHECK(q.layers[3].forward_ms == p.layers[3].forward_ms);  // bit-exact doubles
  CHECK(q.config_hash == "cfg-1234");
}

TEST_CASE("the JSON form is detected by content, not by extension") {
  const auto p = planning::synthetic_gpt_profile({.layers = 4, .gpus_per_node = 2});
  const auto path = temp_path("profile.bin");
  messages::write_profile_json(p, path);
  const auto q = messages::read_profile_file(path);
  std::remove(path.c_str());
  CHECK(q.num_layers() == 4);
  CHECK(json_of(q) == json_of(p));
}

TEST_CASE("unreadable, truncated and inconsistent profile files give one clear error") {
  CHECK(error_reading("/nonexistent/profile.json").find("cannot read profile /nonexistent/profile.json") == 0);

  const auto p = planning::synthetic_gpt_profile({.layers = 4, .gpus_per_node = 2});
  const auto path = temp_path("bad.bin");
  messages::write_profile_capnp(p, path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2 / 8 * 8));
  }
  const auto truncated = error_reading(path);
  CHECK(truncated.find(path + ": profile: not a Cap'n Proto profile") == 0);

  auto wrong = p;
  wrong.gpus_per_node = 3;
  messages::write_profile_capnp(wrong, path);
  CHECK(error_reading(path) == path + ": profile.gpus_per_node: 3 is not a power of two (1, 2, 4, ..., 1024)");
  std::remove(path.c_str());
}

TEST_CASE("a Cap'n Proto profile claiming 2^30 GPUs per node is refused at once, naming the limit") {
  // The old reader passed it (a power of two) to the planner, whose width loop overflowed and never ended.
  const auto bytes = capnp_bytes([](auto root) { root.setGpusPerNode(1u << 30); });
  const auto start = std::chrono::steady_clock::now();
  const auto e = error_decoding(bytes);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK(e == "profile.gpus_per_node: 1073741824 is above the limit of 1024 GPUs per node");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.setGpusPerNode(1u << 31); })).find("above the limit") !=
        std::string::npos);
}

TEST_CASE("Cap'n Proto integers that do not fit are refused, not narrowed") {
  CHECK(error_decoding(capnp_bytes([](auto root) { root.setMicrobatchSize(4294967295u); })) ==
        "profile.microbatch_size: 4294967295 is out of range (at most 2147483647)");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.setDeviceMemoryBytes(1ull << 63); })) ==
        "profile.device_memory_bytes: 9223372036854775808 is out of range (at most 9223372036854775807)");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.getLayers()[1].setParamBytes(1ull << 63); })) ==
        "profile.layers[1].param_bytes: 9223372036854775808 is out of range (at most 9223372036854775807)");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.getLayers()[0].setActivationBytes(1ull << 50); })) ==
        "profile.layers[0].activation_bytes: 1125899906842624 is above the limit of 281474976710656 bytes (256 TiB)");
}

TEST_CASE("Cap'n Proto lists and texts are checked against the limits before they are copied") {
  CHECK(error_decoding(capnp_bytes([](auto root) { root.getLayers()[0].initForwardMs(12); })) ==
        "profile.layers[0].forward_ms: 12 times is above the limit of 11 stage widths (1..1024)");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.getLayers()[0].initBackwardMs(1); })) ==
        "profile.layers[0].backward_ms: 1 times, expected 2 (one per stage width 1..2)");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.setModel(std::string(5000, 'm')); })) ==
        "profile.model: 5000 bytes is above the limit of 4096 bytes");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.getLayers()[1].setName("\xC3\x28"); })) ==
        "profile.layers[1].name: not valid UTF-8");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.initLayers(0); })) == "profile.layers: no layers");
}

TEST_CASE("fuzz finding: a NUL inside a Cap'n Proto text is refused, not truncated on the next write") {
  // A layer named "l\0" decoded with its NUL, and profile_to_capnp wrote it back as "l".
  const auto bytes = capnp_bytes([](auto root) { root.getLayers()[0].setName(capnp::Text::Reader("l\0", 2)); });
  CHECK(error_decoding(bytes) == "profile.layers[0].name: control character 0x00 at byte 1");
  CHECK(error_decoding(capnp_bytes([](auto root) { root.setModel("a\tb"); })) ==
        "profile.model: control character 0x09 at byte 1");
}

TEST_CASE("bytes after the message, or not a whole number of words, are refused") {
  auto bytes = capnp_bytes([](auto) {});
  CHECK(error_decoding(bytes).empty());
  bytes.resize(bytes.size() + 8);
  CHECK(error_decoding(bytes) == "profile: 8 bytes after the end of the Cap'n Proto message");
  bytes.resize(bytes.size() - 3);
  CHECK(error_decoding(bytes).find("not a whole, non-zero number of 8-byte words") != std::string::npos);
  CHECK(error_decoding({}).find("not a whole, non-zero number of 8-byte words") != std::string::npos);
}

TEST_CASE("the one validation applies to a profile built in code") {
  auto p = planning::synthetic_gpt_profile({.layers = 3, .gpus_per_node = 2});
  CHECK_NOTHROW(messages::validate_profile(p));
  p.layers[1].name = "\xFF";
  CHECK_THROWS_WITH_AS(messages::validate_profile(p), "profile.layers[1].name: not valid UTF-8", messages::input_error);
  p = planning::synthetic_gpt_profile({.layers = 3, .gpus_per_node = 2});
  p.device_memory_bytes = 0;
  CHECK_THROWS_WITH_AS(messages::validate_profile(p), "profile.device_memory_bytes: 0, must be >= 1",
                       messages::input_error);
}

TEST_CASE("link costs, output bytes and optimizer times survive both file forms, and older files read them as zero") {
  auto p = planning::synthetic_gpt_profile({.layers = 4, .gpus_per_node = 1});
  p.link = {0.0375, 2.5e6};
  for (int l = 0; l < p.num_layers(); ++l) {
    p.layers[l].output_bytes = 8192 * (l + 1);
    p.layers[l].optimizer_ms = 0.125 * (l + 1);
  }
  const auto json_text = messages::profile_json_text(p, 2);
  const auto capnp_form = messages::profile_to_capnp(p);
  for (const auto& q : {messages::decode_profile(capnp_form), messages::profile_from_json(json_text)}) {
    CHECK(q.link == p.link);
    for (int l = 0; l < p.num_layers(); ++l) {
      CHECK(q.layers[l].output_bytes == p.layers[l].output_bytes);
      CHECK(q.layers[l].optimizer_ms == p.layers[l].optimizer_ms);
    }
  }
  // A profile written before these were measured: no "link", no per-layer fields.
  auto old = nlohmann::json::parse(messages::profile_json_text(p, -1));
  old.erase("link");
  for (auto& layer : old["layers"]) {
    layer.erase("output_bytes");
    layer.erase("optimizer_ms");
  }
  const auto text = old.dump();
  const auto q = messages::profile_from_json(text);
  CHECK(q.link == planning::link_profile{});
  CHECK(q.layers[2].output_bytes == 0);
  CHECK(q.layers[2].optimizer_ms == 0);
  const auto c = messages::profile_to_capnp(q);  // written without a link, read back without one
  CHECK(messages::decode_profile(c).link == planning::link_profile{});
}

TEST_CASE("a negative or non-finite link or optimizer time is refused, naming the field") {
  auto p = planning::synthetic_gpt_profile({.layers = 3, .gpus_per_node = 1});
  p.link.latency_ms = -1;
  CHECK_THROWS_WITH_AS(messages::validate_profile(p), "profile.link.latency_ms: -1; times must be finite and >= 0",
                       messages::input_error);
  p.link = {0.01, -5};
  CHECK_THROWS_WITH_AS(messages::validate_profile(p),
                       doctest::Contains("profile.link.bytes_per_ms"), messages::input_error);
  p.link = {};
  p.layers[2].optimizer_ms = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(messages::validate_profile(p),
                       "profile.layers[2].optimizer_ms: inf; times must be finite and >= 0", messages::input_error);
  p.layers[2].optimizer_ms = 0;
  p.layers[1].output_bytes = -8;
  CHECK_THROWS_WITH_AS(messages::validate_profile(p), doctest::Contains("profile.layers[1].output_bytes: -8"),
                       messages::input_error);
}
