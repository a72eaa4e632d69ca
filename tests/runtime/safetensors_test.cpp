// The safetensors reader and writer (runtime/safetensors.hpp): what the writer writes reads back
// bitwise, half and bfloat16 convert exactly, and every malformed input the specification rules
// out is refused with an error that says what is wrong (never a crash, never a silent value).
#include "runtime/safetensors.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using namespace oobleck::runtime;

namespace {

/// A file from a header text and a byte buffer of `buffer` bytes (values i mod 251).
std::vector<std::byte> file_of(const std::string& header, std::size_t buffer, std::uint64_t announced = UINT64_MAX) {
  const std::uint64_t n = announced == UINT64_MAX ? header.size() : announced;
  std::vector<std::byte> out(8 + header.size() + buffer);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(n >> (8 * i) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < buffer; ++i) out[8 + header.size() + i] = static_cast<std::byte>(i % 251);
  return out;
}

void refused(const std::vector<std::byte>& bytes, const std::string& says) {
  CAPTURE(says);
  CHECK_THROWS_WITH_AS(safetensors_file::parse(bytes, "t.safetensors"), doctest::Contains(says.c_str()), safetensors_error);
}

}  // namespace

TEST_CASE("safetensors: what the writer writes reads back bitwise, with its names, shapes and metadata") {
  const std::vector<float> a{1.5f, -2.25f, 3e-8f, std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f};
  const std::vector<float> b{7.0f};
  const std::vector<float> none;
  const auto bytes = encode_safetensors({{"a.weight", {2, 3}, a}, {"b", {}, b}, {"empty", {0, 4}, none}},
                                        {{"format", "pt"}});
  // The data buffer starts 8-byte aligned (the header is padded with spaces).
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint8_t>(bytes[i]);
  CHECK(n % 8 == 0);
  const auto f = safetensors_file::parse(bytes);
  CHECK(f.metadata().at("format") == "pt");
  REQUIRE(f.tensors().size() == 3);
  const auto* ea = f.find("a.weight");
  REQUIRE(ea != nullptr);
  CHECK(ea->dtype == "F32");
  CHECK(ea->shape == std::vector<std::int64_t>{2, 3});
  const auto va = f.floats(*ea);
  REQUIRE(va.size() == a.size());
  CHECK(std::memcmp(va.data(), a.data(), a.size() * sizeof(float)) == 0);  // -0.0 and denormals too
  CHECK(f.floats(*f.find("b")) == b);
  CHECK(f.find("empty")->numel() == 0);
  CHECK(f.find("missing") == nullptr);

  const auto path = std::filesystem::temp_directory_path() / "oobleck_safetensors_test.safetensors";
  write_safetensors(path.string(), {{"x", {1}, b}});
  CHECK(safetensors_file::read(path.string()).floats(*safetensors_file::read(path.string()).find("x")) == b);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: F16 and BF16 convert to float exactly, other dtypes are refused by name") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x7bff) == 65504.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // the smallest subnormal
  CHECK(half_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(std::isinf(half_to_float(0x7c00)));
  CHECK(std::isnan(half_to_float(0x7e00)));
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(bfloat16_to_float(0x3f80) == 1.0f);
  CHECK(bfloat16_to_float(0xc0a0) == -5.0f);

  // A file of F16 [1, 2] and BF16 [2] values and an I32 one.
  std::string header = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
                       R"("i":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})";
  auto bytes = file_of(header, 12);
  const std::uint8_t values[] = {0x00, 0x3c, 0x00, 0xc0, 0x80, 0x3f, 0xa0, 0xc0};
  std::memcpy(bytes.data() + 8 + header.size(), values, sizeof values);
  const auto f = safetensors_file::parse(bytes);
  CHECK(f.floats(*f.find("h")) == std::vector<float>{1.0f, -2.0f});
  CHECK(f.floats(*f.find("b")) == std::vector<float>{1.0f, -5.0f});
  CHECK_THROWS_WITH_AS(f.floats(*f.find("i")), doctest::Contains("dtype I32"), safetensors_error);
}

TEST_CASE("safetensors: malformed files are refused, saying what is wrong") {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_NOTHROW(safetensors_file::parse(file_of(ok, 8)));
  CHECK_NOTHROW(safetensors_file::parse(file_of(ok + "   ", 8)));  // padding

  refused({}, "too short");
  refused(std::vector<std::byte>(7), "too short");
  refused(file_of(ok, 8, 1'000'000'000), "above the limit");
  refused(file_of(ok, 8, ok.size() + 9), "runs past the end");
  refused(file_of("", 0), "cannot hold a JSON object");
  refused(file_of("[1, 2]", 0), "does not start with '{'");
  refused(file_of("{\"t\": ", 0), "not valid JSON");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
          "named twice");
  refused(file_of(R"({"t":5})", 0), "expected an object");
  refused(file_of(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8), "dtype missing");
  refused(file_of(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype");
  refused(file_of(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8), "shape missing");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), "non-negative integer");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets missing");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before they begin");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8), "past the byte buffer");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes");
  refused(file_of(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
          "more than 2^64");
  // Tiling of the buffer: a gap, an overlap, bytes after the last tensor.
  refused(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
          "a gap in the byte buffer");
  refused(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
          "overlaps");
  refused(file_of(ok, 12), "the tensors cover 8");
  refused(file_of(R"({"__metadata__":{"a":1}})", 0), "must be a string");
  refused(file_of(R"({"__metadata__":[1]})", 0), "object of strings");
}

TEST_CASE("safetensors: the writer refuses what it could not write validly") {
  const std::vector<float> two{1, 2};
  CHECK_THROWS_WITH_AS(encode_safetensors({{"a", {3}, two}}), doctest::Contains("do not fill"), safetensors_error);
  CHECK_THROWS_WITH_AS(encode_safetensors({{"a", {2}, two}, {"a", {2}, two}}), doctest::Contains("written twice"),
                       safetensors_error);
  CHECK_THROWS_AS(encode_safetensors({{"__metadata__", {2}, two}}), safetensors_error);
  CHECK_THROWS_WITH_AS(safetensors_file::read("/nonexistent/model.safetensors"),
                       doctest::Contains("/nonexistent/model.safetensors"), safetensors_error);
}
