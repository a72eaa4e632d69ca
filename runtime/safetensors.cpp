#include "runtime/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace oobleck::runtime {

static_assert(std::endian::native == std::endian::little, "safetensors are little-endian; so is every host we build for");

namespace {

using json = nlohmann::json;

/// Header bytes beyond which a file is refused (the reference implementation's limit).
constexpr std::uint64_t kMaxHeader = 100'000'000;

/// Bytes per element of every dtype the format defines (so that any valid file validates, even
/// when its values cannot be read as floats).
int element_bytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<std::uint8_t>(p[i]);
  return v;
}

std::uint16_t read_le16(const std::byte* p) {
  return static_cast<std::uint16_t>(static_cast<std::uint8_t>(p[0]) | static_cast<std::uint8_t>(p[1]) << 8);
}

/// A non-negative integer of the header (JSON numbers may be unsigned, signed or not integers).
std::uint64_t unsigned_of(const json& v, const std::function<void(const std::string&)>& fail, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  fail(what + " must be a non-negative integer, got " + v.dump());
  return 0;
}

}  // namespace

std::int64_t safetensors_entry::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

float bfloat16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

safetensors_file safetensors_file::parse(std::vector<std::byte> bytes, const std::string& origin) {
  auto owned = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  const std::span<const std::byte> view(owned->data(), owned->size());
  return parse(std::move(owned), view, origin);
}

safetensors_file safetensors_file::parse(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                                         const std::string& origin) {
  auto fail = [&](const std::string& what) -> void { throw safetensors_error(origin + ": " + what); };
  safetensors_file f;
  f.origin_ = origin;
  if (bytes.size() < 8) fail("too short for a safetensors file (" + std::to_string(bytes.size()) + " bytes)");
  const std::uint64_t n = read_le64(bytes.data());
  if (n > kMaxHeader) fail("header length " + std::to_string(n) + " is above the limit of " + std::to_string(kMaxHeader));
  if (n > bytes.size() - 8)
    fail("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(bytes.size()) +
         " bytes)");
  if (n < 2) fail("header length " + std::to_string(n) + " cannot hold a JSON object");
  const std::string text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  if (text.front() != '{') fail("the header does not start with '{'");
  // nlohmann keeps the last of duplicate keys; the format forbids them, so count them as parsed.
  std::set<std::string> seen;
  std::string duplicate;
  json header;
  try {
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1) {
        const auto key = parsed.get<std::string>();
        if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    });
  } catch (const json::exception& e) {
    fail(std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail("tensor \"" + duplicate + "\" is named twice in the header");
  if (!header.is_object()) fail("the header is not a JSON object");
  const std::uint64_t buffer = bytes.size() - 8 - n;
  for (const auto& item : header.items()) {
    const std::string name = item.key();  // (a structured binding cannot be captured by clang 14)
    const json& info = item.value();
    auto fail_at = [&](const std::string& what) { fail("tensor \"" + name + "\": " + what); };
    if (name == "__metadata__") {
      if (!info.is_object()) fail("__metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) fail("__metadata__ \"" + k + "\" must be a string, got " + v.dump());
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!info.is_object()) fail_at("expected an object with dtype, shape and data_offsets");
    safetensors_entry e;
    e.name = name;
    const auto dtype = info.find("dtype");
    const auto shape = info.find("shape");
    const auto offsets = info.find("data_offsets");
    if (dtype == info.end() || !dtype->is_string()) fail_at("dtype missing or not a string");
    e.dtype = dtype->get<std::string>();
    const int width = element_bytes(e.dtype);
    if (width == 0) fail_at("unknown dtype \"" + e.dtype + "\"");
    if (shape == info.end() || !shape->is_array()) fail_at("shape missing or not an array");
    std::uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : *shape) {
      const auto x = unsigned_of(d, fail_at, "a shape dimension");
      if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) fail_at("shape dimension too large");
      e.shape.push_back(static_cast<std::int64_t>(x));
      if (x != 0 && count > std::numeric_limits<std::uint64_t>::max() / x) overflow = true;
      count *= x;
    }
    if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2)
      fail_at("data_offsets missing or not [begin, end]");
    e.begin = unsigned_of((*offsets)[0], fail_at, "data_offsets begin");
    e.end = unsigned_of((*offsets)[1], fail_at, "data_offsets end");
    if (e.begin > e.end) fail_at("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before they begin");
    if (e.end > buffer)
      fail_at("data_offsets end " + std::to_string(e.end) + " is past the byte buffer's " + std::to_string(buffer) + " bytes");
    if (overflow || count > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(width) ||
        count * static_cast<std::uint64_t>(width) != e.end - e.begin)
      fail_at("shape x " + e.dtype + " needs " + (overflow ? std::string("more than 2^64") : std::to_string(count * width)) +
              " bytes, data_offsets give " + std::to_string(e.end - e.begin));
    f.entries_.push_back(std::move(e));
  }
  // The tensors tile the buffer: sorted by offsets, each begins where the previous ended.
  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t at = 0;
  for (const auto& e : f.entries_) {
    if (e.begin < at) fail("tensor \"" + e.name + "\" overlaps the tensor before it (bytes " + std::to_string(e.begin) + " < " + std::to_string(at) + ")");
    if (e.begin > at) fail("a gap in the byte buffer: bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) + ") before tensor \"" + e.name + "\" belong to no tensor");
    at = e.end;
  }
  if (at != buffer)
    fail("the byte buffer has " + std::to_string(buffer) + " bytes but the tensors cover " + std::to_string(at));
  f.data_start_ = 8 + n;
  f.owner_ = std::move(owner);
  f.bytes_ = bytes;
  return f;
}

safetensors_file safetensors_file::read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw safetensors_error(path + ": cannot read the file: " + std::strerror(errno));
  struct ::stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw safetensors_error(path + ": cannot read the file: not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return parse(std::vector<std::byte>{}, path);
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw safetensors_error(path + ": cannot map the file: " + std::strerror(e));
  std::shared_ptr<const void> owner(m, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return parse(owner, {static_cast<const std::byte*>(m), size}, path);
}

const safetensors_entry* safetensors_file::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::span<const std::byte> safetensors_file::bytes(const safetensors_entry& e) const {
  return {bytes_.data() + data_start_ + e.begin, static_cast<std::size_t>(e.end - e.begin)};
}

std::vector<float> safetensors_file::floats(const safetensors_entry& e) const {
  const auto raw = bytes(e);
  std::vector<float> out;
  if (e.dtype == "F32") {
    out.resize(raw.size() / 4);
    if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  } else if (e.dtype == "F16" || e.dtype == "BF16") {
    out.resize(raw.size() / 2);
    const bool half = e.dtype == "F16";
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto v = read_le16(raw.data() + 2 * i);
      out[i] = half ? half_to_float(v) : bfloat16_to_float(v);
    }
  } else {
    throw safetensors_error(origin_ + ": tensor \"" + e.name + "\" has dtype " + e.dtype +
                            "; only F32, F16 and BF16 can be read as weights");
  }
  return out;
}

std::vector<std::byte> encode_safetensors(const std::vector<safetensors_tensor>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") throw safetensors_error("cannot write a tensor named \"" + t.name + "\"");
    if (header.contains(t.name)) throw safetensors_error("tensor \"" + t.name + "\" is written twice");
    std::int64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0) throw safetensors_error("tensor \"" + t.name + "\" has a negative dimension");
      n *= d;
    }
    if (static_cast<std::size_t>(n) != t.values.size())
      throw safetensors_error("tensor \"" + t.name + "\": " + std::to_string(t.values.size()) +
                              " values do not fill its shape (" + std::to_string(n) + ")");
    const std::uint64_t bytes = static_cast<std::uint64_t>(n) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  std::vector<std::byte> out(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(n >> (8 * i) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t at = 8 + text.size();
  for (const auto& t : tensors) {
    if (!t.values.empty()) std::memcpy(out.data() + at, t.values.data(), t.values.size_bytes());
    at += t.values.size_bytes();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<safetensors_tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const auto bytes = encode_safetensors(tensors, metadata);
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw safetensors_error(temp + ": cannot write the file");
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw safetensors_error(temp + ": cannot write the file");
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) throw safetensors_error(path + ": cannot rename the written file into place: " + ec.message());
}

}  // namespace oobleck::runtime
