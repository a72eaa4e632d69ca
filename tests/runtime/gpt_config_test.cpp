// A model config's hash is what a profile records: it must not change with the C locale.
#include "runtime/gpt_config.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "support/comma_locale.hpp"

using oobleck::runtime::gpt_config;

TEST_CASE("the config hash is pinned and the same under a comma-decimal C locale") {
  gpt_config c;
  c.dropout = 0.1;
  // Values of the hash as it always was (printf's %.17g in the "C" locale): profiles stay valid.
  CHECK(c.hash() == "e51c73dd3458d071");
  CHECK(gpt_config{}.hash() == "1f2bd21132299bdb");
  oobleck::test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  // snprintf wrote "dropout=0,10000000000000001" here, so every profile looked stale.
  CHECK(c.hash() == "e51c73dd3458d071");
}

using oobleck::runtime::model_architecture;

namespace {

gpt_config gpt2_config() {
  gpt_config c;
  c.architecture = model_architecture::gpt2;
  return c;
}

std::string validation_error(const gpt_config& c) {
  try {
    oobleck::runtime::validate(c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gpt2 hashes apart from oobleck-gpt and with its tie, init is not hashed") {
  auto g = gpt2_config();
  CHECK(g.hash() != gpt_config{}.hash());
  CHECK(gpt_config{}.hash() == "1f2bd21132299bdb");  // oobleck-gpt keeps the hash it always had
  auto tied = g;
  tied.tie_embeddings = true;
  CHECK(tied.hash() != g.hash());
  auto with_init = tied;
  with_init.init = "/some/folder";
  CHECK(with_init.hash() == tied.hash());
  // Sizes still count for gpt2.
  auto wider = tied;
  wider.d_model *= 2;
  CHECK(wider.hash() != tied.hash());
}

TEST_CASE("tied() is gpt2 with tie_embeddings, architectures have their job-file names") {
  CHECK_FALSE(oobleck::runtime::tied(gpt_config{}));
  auto g = gpt2_config();
  CHECK_FALSE(oobleck::runtime::tied(g));
  g.tie_embeddings = true;
  CHECK(oobleck::runtime::tied(g));
  CHECK(oobleck::runtime::architecture_name(model_architecture::oobleck_gpt) == "oobleck-gpt");
  CHECK(oobleck::runtime::architecture_name(model_architecture::gpt2) == "gpt2");
}

TEST_CASE("validate refuses tied embeddings outside gpt2 and an unknown architecture, naming the field") {
  gpt_config c;
  c.tie_embeddings = true;
  const auto error = validation_error(c);
  CHECK(error.find("tie_embeddings") != std::string::npos);
  CHECK(error.find("oobleck-gpt") != std::string::npos);
  auto g = gpt2_config();
  g.tie_embeddings = true;
  CHECK(validation_error(g).empty());
  gpt_config unknown;
  unknown.architecture = static_cast<model_architecture>(7);
  CHECK(validation_error(unknown).find("architecture") != std::string::npos);
  auto heads = gpt2_config();
  heads.heads = 5;  // 64 is not a multiple of 5
  CHECK(validation_error(heads).find("heads") != std::string::npos);
}

TEST_CASE("presets have GPT-2's published sizes, tied, with dropout 0.1") {
  struct expected {
    const char* name;
    std::int64_t d_model, heads, blocks;
  };
  for (const auto& e : {expected{"gpt2", 768, 12, 12}, expected{"gpt2-medium", 1024, 16, 24},
                        expected{"gpt2-large", 1280, 20, 36}, expected{"gpt2-xl", 1600, 25, 48}}) {
    CAPTURE(e.name);
    const auto c = oobleck::runtime::preset(e.name);
    CHECK(c.architecture == model_architecture::gpt2);
    CHECK(c.tie_embeddings);
    CHECK(c.vocab == 50257);
    CHECK(c.seq_len == 1024);
    CHECK(c.d_model == e.d_model);
    CHECK(c.heads == e.heads);
    CHECK(c.blocks == e.blocks);
    CHECK(c.dropout == 0.1);
    CHECK(c.seed == gpt_config{}.seed);
    CHECK(c.init.empty());
    CHECK(validation_error(c).empty());
  }
}

TEST_CASE("an unknown preset is refused, listing the known ones") {
  std::string error;
  try {
    oobleck::runtime::preset("gpt3");
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  CHECK(error.find("\"gpt3\"") != std::string::npos);
  for (const char* known : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}) CHECK(error.find(known) != std::string::npos);
}
