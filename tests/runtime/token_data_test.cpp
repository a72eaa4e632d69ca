// Token data (runtime/dataset.hpp): token files of uint16 and uint32 ids, read as the windows the
// sampler draws; odd sizes, short files and ids beyond the vocabulary refused with the path (and
// the byte offset of the first bad id).
#include <torch/torch.h>

#include "runtime/dataset.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

using namespace oobleck::runtime;
namespace fs = std::filesystem;

namespace {

template <class T>
std::string write_ids(const std::string& name, const std::vector<T>& ids) {
  const auto path = (fs::temp_directory_path() / ("oobleck_token_data_test_" + name)).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (T id : ids)
    for (std::size_t b = 0; b < sizeof(T); ++b) out.put(static_cast<char>(static_cast<std::uint64_t>(id) >> (8 * b) & 0xff));
  return path;
}

}  // namespace

TEST_CASE("token files: uint16 and uint32 ids form the windows from i*T to i*T + T + 1, little-endian") {
  std::vector<std::uint16_t> ids16(41);
  std::iota(ids16.begin(), ids16.end(), std::uint16_t{500});
  ids16[7] = 65535;
  const auto p16 = write_ids("u16.bin", ids16);
  const auto d16 = make_dataset(data_source::token_file(p16, token_dtype::uint16), 8, 65536);
  CHECK(d16.tokens() == 41);
  CHECK(d16.size() == 5);  // (41 - 1) / 8
  const auto [x, y] = d16.batch({0, 4});
  CHECK(x[0][7].item<std::int64_t>() == 65535);
  CHECK(y[0][6].item<std::int64_t>() == 65535);
  CHECK(x[1][0].item<std::int64_t>() == 532);
  CHECK(y[1][7].item<std::int64_t>() == 540);  // the last id of the file

  const std::vector<std::uint32_t> ids32{70000, 1, 2, 3, 100000, 5, 6, 7, 8};
  const auto p32 = write_ids("u32.bin", ids32);
  const auto d32 = make_dataset(data_source::token_file(p32, token_dtype::uint32), 4, 100001);
  CHECK(d32.size() == 2);
  const auto [x32, y32] = d32.batch({0, 1});
  CHECK(x32[0][0].item<std::int64_t>() == 70000);
  CHECK(y32[0][3].item<std::int64_t>() == 100000);
  CHECK(x32[1][0].item<std::int64_t>() == 100000);
  // The same bytes read as uint16 are other ids (and a whole number of them).
  CHECK(make_dataset(data_source::token_file(p32, token_dtype::uint16), 4, 65536).tokens() == 18);
  fs::remove(p16);
  fs::remove(p32);
}

TEST_CASE("token files: an id >= vocab is refused with the path and its byte offset") {
  const auto p = write_ids("big.bin", std::vector<std::uint16_t>{1, 2, 3, 300, 5, 400, 7, 8, 9});
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(p), 4, 256),
                       (p + ": token id 300 at byte offset 6 is >= model vocab 256").c_str(), std::runtime_error);
  CHECK_NOTHROW(make_dataset(data_source::token_file(p), 4, 401));
  const auto p32 = write_ids("big32.bin", std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 1u << 20});
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(p32, token_dtype::uint32), 4, 50257),
                       doctest::Contains("at byte offset 32"), std::runtime_error);
  fs::remove(p);
  fs::remove(p32);
}

TEST_CASE("token files: odd sizes, short files and missing files are refused naming the path") {
  const auto odd = (fs::temp_directory_path() / "oobleck_token_data_test_odd.bin").string();
  std::ofstream(odd, std::ios::binary) << std::string(11, '\1');
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(odd), 2, 256),
                       (odd + ": 11 bytes is not a whole number of uint16 token ids (2 bytes each)").c_str(), std::runtime_error);
  std::ofstream(odd, std::ios::binary | std::ios::trunc) << std::string(12, '\1');
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(odd, token_dtype::uint32), 3, 1 << 30),
                       doctest::Contains("has 3 tokens, fewer than one sample of 4"), std::runtime_error);
  CHECK(make_dataset(data_source::token_file(odd, token_dtype::uint32), 2, 1 << 30).size() == 1);
  std::ofstream(odd, std::ios::binary | std::ios::trunc);
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(odd), 2, 256), doctest::Contains(odd.c_str()), std::runtime_error);
  fs::remove(odd);
  CHECK_THROWS_WITH_AS(make_dataset(data_source::token_file(odd), 2, 256), doctest::Contains(odd.c_str()), std::runtime_error);
}

TEST_CASE("byte-level data: a text file and the generated corpus are bytes as ids, and need vocab >= 256") {
  const auto text = (fs::temp_directory_path() / "oobleck_token_data_test.txt").string();
  std::ofstream(text, std::ios::binary) << "hello, world\xff";
  const auto d = make_dataset(data_source::text_file(text), 4, 256);
  CHECK(d.size() == 3);
  CHECK(d.batch({2}).second[0][3].item<std::int64_t>() == 255);
  CHECK_THROWS_WITH_AS(make_dataset(data_source::text_file(text), 4, 100), doctest::Contains("too small"),
                       std::runtime_error);
  fs::remove(text);
  // The default source is the corpus the main job has always trained on.
  const auto g = make_dataset(data_source::generated(4096, 7), 16, 256);
  const token_dataset old(default_corpus(4096, 7), 16);
  CHECK(g.size() == old.size());
  CHECK(torch::equal(g.batch({0, 5, 100}).first, old.batch({0, 5, 100}).first));
}
