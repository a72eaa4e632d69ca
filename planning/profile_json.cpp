#include "planning/profile_json.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace oobleck::planning {

namespace {

[[noreturn]] void fail(const std::string& what) { throw planning_error("invalid profile: " + what); }

void reject_unknown_keys(const json::value& obj, std::initializer_list<std::string_view> known,
                         const std::string& where) {
  for (const auto& [key, v] : obj.as_object()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail("unknown key \"" + key + "\" in " + where + " (known keys: " + list + ")");
    }
  }
}

const json::value& required(const json::value& obj, std::string_view key, const std::string& where) {
  const json::value* v = obj.find(key);
  if (!v) fail("missing key \"" + std::string(key) + "\" in " + where);
  return *v;
}

std::int64_t integer_field(const json::value& obj, std::string_view key, const std::string& where) {
  const auto& v = required(obj, key, where);
  if (v.is_integer()) return v.as_integer();
  // Accept 8.0 or 8e9 written as a float when it is an exact integer.
  if (v.is_number() && std::isfinite(v.as_number()) && v.as_number() == std::floor(v.as_number()) &&
      std::fabs(v.as_number()) < 9.0e15)
    return static_cast<std::int64_t>(v.as_number());
  fail("\"" + std::string(key) + "\" in " + where + " must be an integer, got " + v.type_name());
}

std::string string_field(const json::value& obj, std::string_view key, const std::string& where,
                         bool optional) {
  const json::value* v = obj.find(key);
  if (!v) {
    if (optional) return {};
    fail("missing key \"" + std::string(key) + "\" in " + where);
  }
  if (!v->is_string()) fail("\"" + std::string(key) + "\" in " + where + " must be a string");
  return v->as_string();
}

std::vector<double> width_times(const json::value& obj, std::string_view key, const std::string& where,
                                int gpus_per_node) {
  const auto& v = required(obj, key, where);
  if (!v.is_object())
    fail("\"" + std::string(key) + "\" in " + where + " must be an object {\"1\": ms, \"2\": ms, ...}");
  const auto widths = stage_widths(gpus_per_node);
  std::vector<double> times(widths.size(), std::nan(""));
  for (const auto& [width_key, t] : v.as_object()) {
    int d = 0;
    try {
      std::size_t used = 0;
      d = std::stoi(width_key, &used);
      if (used != width_key.size()) d = 0;
    } catch (...) {
      d = 0;
    }
    if (!is_power_of_two(d) || d > gpus_per_node)
      fail("\"" + std::string(key) + "\" in " + where + " has width key \"" + width_key +
           "\"; widths are powers of two up to gpus_per_node = " + std::to_string(gpus_per_node));
    if (!t.is_number())
      fail("\"" + std::string(key) + "\" in " + where + " width " + width_key + " must be a number");
    times[width_index(d)] = t.as_number();
  }
  for (std::size_t i = 0; i < widths.size(); ++i)
    if (std::isnan(times[i]))
      fail("\"" + std::string(key) + "\" in " + where + " is missing width \"" + std::to_string(widths[i]) +
           "\" (every power of two up to gpus_per_node = " + std::to_string(gpus_per_node) + " is needed)");
  return times;
}

json::value times_to_json(const std::vector<double>& times) {
  json::object o;
  for (std::size_t i = 0; i < times.size(); ++i) o.emplace_back(std::to_string(1 << i), times[i]);
  return o;
}

}  // namespace

profile profile_from_json(std::string_view text) {
  const json::value root = json::parse(text);
  if (!root.is_object()) fail("the top level must be an object");
  reject_unknown_keys(root,
                      {"model", "config_hash", "device_kind", "microbatch_size", "gpus_per_node",
                       "device_memory_bytes", "layers"},
                      "the profile");
  profile p;
  p.model = string_field(root, "model", "the profile", false);
  p.config_hash = string_field(root, "config_hash", "the profile", true);
  p.device_kind = string_field(root, "device_kind", "the profile", true);
  p.microbatch_size = static_cast<int>(integer_field(root, "microbatch_size", "the profile"));
  const auto m = integer_field(root, "gpus_per_node", "the profile");
  if (!is_power_of_two(m) || m > 1024)
    fail("gpus_per_node is " + std::to_string(m) + ", must be a power of two between 1 and 1024");
  p.gpus_per_node = static_cast<int>(m);
  p.device_memory_bytes = integer_field(root, "device_memory_bytes", "the profile");
  const auto& layers = required(root, "layers", "the profile");
  if (!layers.is_array()) fail("\"layers\" must be an array");
  for (std::size_t i = 0; i < layers.as_array().size(); ++i) {
    const auto& l = layers.as_array()[i];
    const std::string where = "layer " + std::to_string(i);
    if (!l.is_object()) fail(where + " must be an object");
    reject_unknown_keys(l, {"name", "forward_ms", "backward_ms", "param_bytes", "activation_bytes"}, where);
    layer_profile layer;
    layer.name = string_field(l, "name", where, false);
    layer.forward_ms = width_times(l, "forward_ms", where, p.gpus_per_node);
    layer.backward_ms = width_times(l, "backward_ms", where, p.gpus_per_node);
    layer.param_bytes = integer_field(l, "param_bytes", where);
    layer.activation_bytes = integer_field(l, "activation_bytes", where);
    p.layers.push_back(std::move(layer));
  }
  validate(p);
  return p;
}

json::value profile_to_json(const profile& p) {
  json::object root;
  root.emplace_back("model", p.model);
  if (!p.config_hash.empty()) root.emplace_back("config_hash", p.config_hash);
  if (!p.device_kind.empty()) root.emplace_back("device_kind", p.device_kind);
  root.emplace_back("microbatch_size", p.microbatch_size);
  root.emplace_back("gpus_per_node", p.gpus_per_node);
  root.emplace_back("device_memory_bytes", p.device_memory_bytes);
  json::array layers;
  for (const auto& l : p.layers) {
    json::object o;
    o.emplace_back("name", l.name);
    o.emplace_back("forward_ms", times_to_json(l.forward_ms));
    o.emplace_back("backward_ms", times_to_json(l.backward_ms));
    o.emplace_back("param_bytes", l.param_bytes);
    o.emplace_back("activation_bytes", l.activation_bytes);
    layers.emplace_back(std::move(o));
  }
  root.emplace_back("layers", std::move(layers));
  return root;
}

}  // namespace oobleck::planning
