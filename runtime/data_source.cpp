#include "runtime/data_source.hpp"

#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace oobleck::runtime {

std::string dtype_name(token_dtype t) { return t == token_dtype::uint16 ? "uint16" : "uint32"; }

token_dtype parse_dtype(const std::string& name) {
  if (name == "uint16") return token_dtype::uint16;
  if (name == "uint32") return token_dtype::uint32;
  throw std::invalid_argument("token dtype must be \"uint16\" or \"uint32\", got \"" + name + "\"");
}

data_source data_source::generated(std::int64_t bytes, std::uint64_t seed) {
  data_source s;
  s.corpus_bytes = bytes;
  s.corpus_seed = seed;
  return s;
}

data_source data_source::text_file(std::string path) {
  data_source s;
  s.kind = kind_t::text;
  s.path = std::move(path);
  return s;
}

data_source data_source::token_file(std::string path, token_dtype dtype) {
  data_source s;
  s.kind = kind_t::tokens;
  s.path = std::move(path);
  s.dtype = dtype;
  return s;
}

std::string describe(const data_source& s) {
  switch (s.kind) {
    case data_source::kind_t::none: return "none";
    case data_source::kind_t::generated:
      return "generated " + std::to_string(s.corpus_bytes) + " " + std::to_string(s.corpus_seed);
    case data_source::kind_t::text: return "text " + s.path;
    case data_source::kind_t::tokens: return "tokens " + dtype_name(s.dtype) + " " + s.path;
  }
  return "unknown";
}

std::int64_t token_count(const data_source& s) {
  switch (s.kind) {
    case data_source::kind_t::none: return 0;
    case data_source::kind_t::generated: return s.corpus_bytes;
    default: break;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(s.path, ec))
    throw std::runtime_error(s.path + ": " + (ec ? ec.message() : std::string("not a readable file")));
  const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(s.path, ec));
  if (ec) throw std::runtime_error(s.path + ": " + ec.message());
  if (s.kind == data_source::kind_t::text) return bytes;
  const int width = dtype_bytes(s.dtype);
  if (bytes % width != 0)
    throw std::runtime_error(s.path + ": " + std::to_string(bytes) + " bytes is not a whole number of " +
                             dtype_name(s.dtype) + " token ids (" + std::to_string(width) + " bytes each)");
  return bytes / width;
}

}  // namespace oobleck::runtime
