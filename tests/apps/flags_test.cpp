#include "apps/flags.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "messages/input_error.hpp"
#include "support/comma_locale.hpp"

using namespace oobleck;

namespace {

/// --n through add_integer in [-100, 2^40]; the value, or the error's text.
std::string integer_flag(const std::string& text) {
  CLI::App app;
  std::int64_t n = 0;
  apps::add_integer(app, "--n", n, std::int64_t{-100}, std::int64_t{1} << 40, "");
  std::ostringstream out;
  try {
    apps::parse_flags(app, {"--n", text}, out);
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return std::to_string(n);
}

/// --x through add_number with no lower bound to speak of; the value, or the error's text.
std::string number_flag(const std::string& text) {
  CLI::App app;
  double x = 0;
  apps::add_number(app, "--x", x, -1e300, "");
  std::ostringstream out;
  try {
    apps::parse_flags(app, {"--x=" + text}, out);
  } catch (const messages::input_error& e) {
    return e.what();
  }
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

TEST_CASE("integer flags are the whole text, base 10, one leading '+' allowed") {
  CHECK(integer_flag("42") == "42");
  CHECK(integer_flag("+42") == "42");
  CHECK(integer_flag("-7") == "-7");
  CHECK(integer_flag("010") == "10");  // not octal
  CHECK(integer_flag("4x") == "--n expects an integer, got '4x'");
  CHECK(integer_flag(" 4") == "--n expects an integer, got ' 4'");
  CHECK(integer_flag("+-4") == "--n expects an integer, got '+-4'");
  CHECK(integer_flag("++4") == "--n expects an integer, got '++4'");
  CHECK(integer_flag("+") == "--n expects an integer, got '+'");
  CHECK(integer_flag("0x10") == "--n expects an integer, got '0x10'");
  CHECK(integer_flag("9223372036854775808") == "--n must be <= 1099511627776, got 9223372036854775808");
  CHECK(integer_flag("-101") == "--n must be >= -100, got -101");
}

TEST_CASE("number flags are the whole text and finite") {
  CHECK(number_flag("2.5") == "2.5");
  CHECK(number_flag("+.5") == "0.5");
  CHECK(number_flag("1e-3") == "0.001");
  CHECK(number_flag("nan") == "--x expects a finite number, got 'nan'");
  CHECK(number_flag("inf") == "--x expects a finite number, got 'inf'");
  CHECK(number_flag("1e400") == "--x expects a finite number, got '1e400'");
  CHECK(number_flag("1,5") == "--x expects a finite number, got '1,5'");
  CHECK(number_flag("+-1") == "--x expects a finite number, got '+-1'");
}

TEST_CASE("node id lists") {
  CHECK(apps::parse_id_list("--fail", "3,7,+9") == std::vector<int>{3, 7, 9});
  CHECK_THROWS_WITH_AS(apps::parse_id_list("--fail", "1,,2"), "--fail expects comma-separated node ids, got '1,,2'",
                       messages::input_error);
  CHECK_THROWS_AS(apps::parse_id_list("--fail", "-1"), messages::input_error);
  CHECK_THROWS_AS(apps::parse_id_list("--fail", "2147483648"), messages::input_error);
}

TEST_CASE("number flags read the same under a comma-decimal C locale") {
  test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  CHECK(number_flag("0.25") == "0.25");
  CHECK(number_flag("1e-3") == "0.001");
  CHECK(number_flag("1,5") == "--x expects a finite number, got '1,5'");
  // The lower bound prints with '.', too.
  CLI::App app;
  double x = 0;
  apps::add_number(app, "--x", x, 0.5, "");
  std::ostringstream out;
  CHECK_THROWS_WITH_AS(apps::parse_flags(app, {"--x", "0.25"}, out), "--x must be >= 0.5, got 0.25",
                       messages::input_error);
}
