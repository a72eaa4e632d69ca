#include "messages/profile_file.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <locale>
#include <sstream>

#include "messages/input_error.hpp"
#include "messages/profile_capnp.hpp"
#include "messages/profile_json.hpp"

namespace oobleck::messages {

namespace {

[[noreturn]] void fail(std::string_view path, const std::string& what) {
  throw input_error(std::string(path) + ": " + what);
}

// RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    std::uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<std::size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

void check_text(const std::string& s, const std::string& path) {
  if (s.size() > profile_limits::max_text_bytes)
    fail(path, std::to_string(s.size()) + " bytes is above the limit of " + std::to_string(profile_limits::max_text_bytes) +
                   " bytes");
  if (!is_utf8(s)) fail(path, "not valid UTF-8");
  // Control characters have no place in a name, and a NUL would not survive Cap'n Proto's Text.
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02X", c);
      fail(path, std::string("control character ") + code + " at byte " + std::to_string(i));
    }
  }
}

void check_bytes(std::int64_t v, std::int64_t min, const std::string& path) {
  if (v < min) fail(path, std::to_string(v) + ", must be >= " + std::to_string(min));
  if (v > profile_limits::max_bytes)
    fail(path, std::to_string(v) + " is above the limit of " + std::to_string(profile_limits::max_bytes) + " bytes (256 TiB)");
}

/// `x` as the messages write it: the stream's shortest form, whatever the C locale.
std::string number_text(double x) {
  std::ostringstream value;
  value.imbue(std::locale::classic());
  value << x;
  return value.str();
}

void check_time(double t, const std::string& path) {
  if (!std::isfinite(t) || t < 0) fail(path, number_text(t) + "; times must be finite and >= 0");
  if (t > profile_limits::max_layer_ms) fail(path, number_text(t) + " ms, above the limit of 1e9 ms");
}

void check_times(const std::vector<double>& times, int gpus_per_node, const std::string& path) {
  const auto widths = planning::stage_widths(gpus_per_node);
  if (times.size() != widths.size())
    fail(path, std::to_string(times.size()) + " times, expected " + std::to_string(widths.size()) +
                   " (one per stage width 1.." + std::to_string(gpus_per_node) + ")");
  for (std::size_t i = 0; i < times.size(); ++i) {
    const std::string at = "width " + std::to_string(widths[i]) + " is " + number_text(times[i]);
    if (!std::isfinite(times[i]) || times[i] < 0) fail(path, at + "; times must be finite and >= 0");
    if (times[i] > profile_limits::max_layer_ms) fail(path, at + " ms, above the limit of 1e9 ms for one layer");
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read profile " + path + ": " + std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    bytes.append(buf, static_cast<std::size_t>(in.gcount()));
    if (bytes.size() > profile_limits::max_file_bytes)
      throw input_error(path + ": larger than the limit of " + std::to_string(profile_limits::max_file_bytes) +
                        " bytes for a profile");
  }
  if (in.bad()) throw input_error("cannot read profile " + path + ": " + std::strerror(errno));
  return bytes;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw input_error("cannot write profile " + path + ": " + std::strerror(errno));
}

}  // namespace

int checked_gpus_per_node(std::int64_t m, std::string_view path) {
  if (m > profile_limits::max_gpus_per_node)
    fail(path, std::to_string(m) + " is above the limit of " + std::to_string(profile_limits::max_gpus_per_node) +
                   " GPUs per node");
  if (!planning::is_power_of_two(m))
    fail(path, std::to_string(m) + " is not a power of two (1, 2, 4, ..., " +
                   std::to_string(profile_limits::max_gpus_per_node) + ")");
  return static_cast<int>(m);
}

void check_layer_count(std::size_t layers, std::string_view path) {
  if (layers == 0) fail(path, "no layers");
  if (layers > profile_limits::max_layers)
    fail(path, std::to_string(layers) + " layers is above the limit of " + std::to_string(profile_limits::max_layers) +
                   " layers");
}

void validate_profile(const planning::profile& p) {
  check_text(p.model, "profile.model");
  check_text(p.config_hash, "profile.config_hash");
  check_text(p.device_kind, "profile.device_kind");
  if (p.microbatch_size < 1) fail("profile.microbatch_size", std::to_string(p.microbatch_size) + ", must be >= 1");
  checked_gpus_per_node(p.gpus_per_node, "profile.gpus_per_node");
  check_bytes(p.device_memory_bytes, 1, "profile.device_memory_bytes");
  check_layer_count(p.layers.size(), "profile.layers");
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    const auto& layer = p.layers[l];
    const std::string path = "profile.layers[" + std::to_string(l) + "]";
    check_text(layer.name, path + ".name");
    check_times(layer.forward_ms, p.gpus_per_node, path + ".forward_ms");
    check_times(layer.backward_ms, p.gpus_per_node, path + ".backward_ms");
    check_bytes(layer.param_bytes, 0, path + ".param_bytes");
    check_bytes(layer.activation_bytes, 0, path + ".activation_bytes");
    check_bytes(layer.output_bytes, 0, path + ".output_bytes");
    check_time(layer.optimizer_ms, path + ".optimizer_ms");
  }
  check_time(p.link.latency_ms, "profile.link.latency_ms");
  if (!std::isfinite(p.link.bytes_per_ms) || p.link.bytes_per_ms < 0)
    fail("profile.link.bytes_per_ms",
         number_text(p.link.bytes_per_ms) + "; it must be finite and >= 0 (0: bytes are free)");
  // The planner's own precondition; everything it checks was checked above, so this never throws
  // unless the two drift apart.
  try {
    planning::validate(p);
  } catch (const planning::planning_error& e) {
    throw input_error(std::string("profile: ") + e.what());
  }
}

planning::profile decode_profile(std::span<const std::byte> bytes) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') return profile_from_json(text);
  return profile_from_capnp(bytes);
}

planning::profile read_profile_file(const std::string& path) {
  const std::string bytes = read_file(path);
  try {
    return decode_profile(std::as_bytes(std::span(bytes.data(), bytes.size())));
  } catch (const input_error& e) {
    throw input_error(path + ": " + e.what());
  }
}

void write_profile_capnp(const planning::profile& p, const std::string& path) {
  const auto bytes = profile_to_capnp(p);
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

void write_profile_json(const planning::profile& p, const std::string& path) {
  write_file(path, profile_json_text(p, 2) + "\n");
}

}  // namespace oobleck::messages
