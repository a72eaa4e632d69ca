#include "messages/profile_file.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "planning/profile_json.hpp"
#include "planning/synthetic_profile.hpp"

using namespace oobleck;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/oobleck-test-" + std::to_string(::getpid()) + "-" + name;
}

std::string error_reading(const std::string& path) {
  try {
    messages::read_profile_file(path);
  } catch (const planning::planning_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a profile survives the Cap'n Proto file round trip exactly") {
  auto p = planning::synthetic_gpt_profile({.layers = 6, .gpus_per_node = 4});
  p.config_hash = "cfg-1234";
  const auto path = temp_path("profile.bin");
  messages::write_profile_capnp(p, path);
  const auto q = messages::read_profile_file(path);
  std::remove(path.c_str());
  CHECK(planning::json::dump(planning::profile_to_json(q)) == planning::json::dump(planning::profile_to_json(p)));
  CHECK(q.layers[3].forward_ms == p.layers[3].forward_ms);  // bit-exact doubles
  CHECK(q.config_hash == "cfg-1234");
}

TEST_CASE("the JSON form is detected by content, not by extension") {
  const auto p = planning::synthetic_gpt_profile({.layers = 4, .gpus_per_node = 2});
  const auto path = temp_path("profile.bin");
  messages::write_profile_json(p, path);
  CHECK(messages::read_profile_file(path).num_layers() == 4);
  std::remove(path.c_str());
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
  CHECK(truncated.find(path) == 0);
  CHECK(truncated.find("not a Cap'n Proto profile") != std::string::npos);

  auto wrong = p;
  wrong.gpus_per_node = 3;
  messages::write_profile_capnp(wrong, path);
  CHECK(error_reading(path).find("power of two") != std::string::npos);
  std::remove(path.c_str());
}
