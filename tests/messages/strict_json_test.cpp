#include "messages/strict_json.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "support/comma_locale.hpp"

using namespace oobleck::messages;

namespace {

std::string error_of(const std::string& text) {
  try {
    json::parse_strict(text, "doc");
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const std::function<void()>& decode) {
  try {
    decode();
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("syntax errors name the line and column") {
  const auto e = error_of("{\n  \"a\": 1,\n  \"b\": [1, 2,]\n}");
  CHECK(e.rfind("doc: JSON syntax error at line 3 column", 0) == 0);
  CHECK(error_of("").find("unexpected end of input") != std::string::npos);
  CHECK(error_of("{\"a\": 1} x").find("JSON syntax error") != std::string::npos);
  CHECK(error_of("[1e400]").find("doc: invalid JSON: number overflow") == 0);
}

TEST_CASE("duplicate keys are refused at any depth, with their path") {
  CHECK(error_of(R"({"a": 1, "a": 2})") == "doc.a: duplicate key \"a\"");
  CHECK(error_of(R"({"l": [{"x": 1}, {"x": 1, "y": {"1": 0, "1": 0}}]})") == R"(doc.l[1].y["1"]: duplicate key "1")");
  CHECK(error_of(R"({"a": {"k": 1}, "b": {"k": 1}})").empty());  // same key in sibling objects is fine
}

TEST_CASE("nesting is capped") {
  const std::string deep = std::string(json::max_depth + 1, '[') + std::string(json::max_depth + 1, ']');
  CHECK(error_of(deep).find("nesting deeper than 64 levels") != std::string::npos);
  const std::string ok = std::string(json::max_depth, '[') + std::string(json::max_depth, ']');
  CHECK(error_of(ok).empty());
}

TEST_CASE("the number of values is capped") {
  std::string many = "[";
  for (std::size_t i = 0; i < json::max_values; ++i) many += i ? ",0" : "0";
  CHECK(error_of(many + "]") == "doc[1048575]: more than 1048576 values");  // the array itself is one
  CHECK(error_of("[" + many.substr(3) + "]").empty());
}

TEST_CASE("a surrogate pair decodes to one 4-byte UTF-8 sequence") {
  // The old parser wrote each half as its own 3-byte sequence (CESU-8): invalid UTF-8.
  const auto v = json::parse_strict(R"(["\ud83d\ude00"])", "doc");
  CHECK(v[0].get<std::string>() == "\xF0\x9F\x98\x80");  // U+1F600
  CHECK(json::parse_strict(R"(["\u00e9"])", "doc")[0].get<std::string>() == "\xC3\xA9");
  CHECK(error_of(R"(["\ud83d"])").find("JSON syntax error") != std::string::npos);  // lone high half
  CHECK(error_of(R"(["\ude00"])").find("JSON syntax error") != std::string::npos);  // lone low half
  CHECK(error_of("[\"\xC3\x28\"]").find("JSON syntax error") != std::string::npos);  // invalid UTF-8 byte
}

TEST_CASE("numbers parse the same under a comma-decimal C locale") {
  oobleck::test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  REQUIRE(std::strtod("1.5", nullptr) == 1.0);  // what the old parser's strtod read
  const auto v = json::parse_strict("[1.5, 2.25e1, -0.125]", "doc");
  CHECK(v[0].get<double>() == 1.5);
  CHECK(v[1].get<double>() == 22.5);
  CHECK(v[2].get<double>() == -0.125);
}

TEST_CASE("typed access names the path and the type found") {
  const auto doc = json::parse_strict(R"({"n": "x", "o": {"a": [1, 2.5, 8.0, 18446744073709551615, 1e300]}})", "doc");
  const json::node root(doc, "doc");
  CHECK(error_of([&] { root.member("n").as_integer(); }) == "doc.n: expected an integer, got string");
  CHECK(error_of([&] { root.member("o").as_number(); }) == "doc.o: expected a number, got object");
  CHECK(error_of([&] { root.member("zz"); }) == "doc: missing key \"zz\"");
  CHECK(error_of([&] { root.expect_keys({"n"}); }) == "doc: unknown key \"o\" (known keys: n)");
  const auto a = root.member("o").member("a").elements();
  CHECK(a[0].as_integer() == 1);
  CHECK(error_of([&] { a[1].as_integer(); }) == "doc.o.a[1]: expected an integer, got 2.5");
  CHECK(a[2].as_integer() == 8);
  CHECK(error_of([&] { a[3].as_integer(); }).find("doc.o.a[3]: 18446744073709551615 is out of range") == 0);
  CHECK(error_of([&] { a[4].as_integer(); }).find("doc.o.a[4]: 1e+300 is out of range") == 0);
  CHECK(a[1].as_number() == 2.5);
}
