// A model config's hash is what a profile records: it must not change with the C locale.
#include "runtime/gpt_config.hpp"

#include <doctest/doctest.h>

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
