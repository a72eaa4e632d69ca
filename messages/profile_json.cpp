#include "messages/profile_json.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include "messages/checked.hpp"
#include "messages/profile_file.hpp"
#include "messages/strict_json.hpp"

namespace oobleck::messages {

namespace {

// Width keys are "1", "2", "4", ...: plain decimal, no sign, no leading zero.
std::optional<int> width_of(const std::string& key) {
  int d = 0;
  if (key.empty() || key[0] == '0') return std::nullopt;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), d);
  if (ec != std::errc() || end != key.data() + key.size()) return std::nullopt;
  return d;
}

std::vector<double> width_times(const json::node& times, int gpus_per_node) {
  const auto widths = planning::stage_widths(gpus_per_node);
  std::vector<double> out(widths.size(), std::numeric_limits<double>::quiet_NaN());
  for (const auto& [key, t] : times.members()) {
    const auto d = width_of(key);
    if (!d || !planning::is_power_of_two(*d) || *d > gpus_per_node)
      t.fail("not a stage width; widths are powers of two up to gpus_per_node = " + std::to_string(gpus_per_node));
    out[planning::width_index(*d)] = t.as_number();
  }
  for (std::size_t i = 0; i < widths.size(); ++i)
    if (std::isnan(out[i]))
      times.fail("missing width \"" + std::to_string(widths[i]) + "\" (every power of two up to gpus_per_node = " +
                 std::to_string(gpus_per_node) + " is needed)");
  return out;
}

nlohmann::ordered_json times_to_json(const std::vector<double>& times) {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < times.size(); ++i) o[std::to_string(std::int64_t{1} << i)] = times[i];
  return o;
}

}  // namespace

planning::profile profile_from_json(std::string_view text) {
  if (text.size() > profile_limits::max_file_bytes)
    throw input_error("profile: " + std::to_string(text.size()) + " bytes is above the limit of " +
                      std::to_string(profile_limits::max_file_bytes) + " bytes for a profile");
  const auto doc = json::parse_strict(text, "profile");
  const json::node root(doc, "profile");
  root.expect_keys({"model", "config_hash", "device_kind", "microbatch_size", "gpus_per_node", "device_memory_bytes",
                    "layers", "link"});
  planning::profile p;
  p.model = root.member("model").as_string();
  if (const auto h = root.optional_member("config_hash")) p.config_hash = h->as_string();
  if (const auto k = root.optional_member("device_kind")) p.device_kind = k->as_string();
  const auto mb = root.member("microbatch_size");
  p.microbatch_size = checked_cast<int>(mb.as_integer(), mb.path());
  // M first: the width keys of every layer are read against it.
  const auto m = root.member("gpus_per_node");
  p.gpus_per_node = checked_gpus_per_node(m.as_integer(), m.path());
  p.device_memory_bytes = root.member("device_memory_bytes").as_integer();
  const auto layers = root.member("layers");
  const auto elements = layers.elements();
  check_layer_count(elements.size(), layers.path());
  for (const auto& l : elements) {
    l.expect_keys({"name", "forward_ms", "backward_ms", "param_bytes", "activation_bytes", "output_bytes", "optimizer_ms"});
    planning::layer_profile layer;
    layer.name = l.member("name").as_string();
    layer.forward_ms = width_times(l.member("forward_ms"), p.gpus_per_node);
    layer.backward_ms = width_times(l.member("backward_ms"), p.gpus_per_node);
    layer.param_bytes = l.member("param_bytes").as_integer();
    layer.activation_bytes = l.member("activation_bytes").as_integer();
    // Profiles written before these were measured do not have them: 0, as the planner reads it.
    if (const auto o = l.optional_member("output_bytes")) layer.output_bytes = o->as_integer();
    if (const auto o = l.optional_member("optimizer_ms")) layer.optimizer_ms = o->as_number();
    p.layers.push_back(std::move(layer));
  }
  if (const auto link = root.optional_member("link")) {
    link->expect_keys({"latency_ms", "bytes_per_ms"});
    p.link.latency_ms = link->member("latency_ms").as_number();
    p.link.bytes_per_ms = link->member("bytes_per_ms").as_number();
  }
  validate_profile(p);
  return p;
}

nlohmann::ordered_json profile_to_json(const planning::profile& p) {
  nlohmann::ordered_json root;
  root["model"] = p.model;
  if (!p.config_hash.empty()) root["config_hash"] = p.config_hash;
  if (!p.device_kind.empty()) root["device_kind"] = p.device_kind;
  root["microbatch_size"] = p.microbatch_size;
  root["gpus_per_node"] = p.gpus_per_node;
  root["device_memory_bytes"] = p.device_memory_bytes;
  auto layers = nlohmann::ordered_json::array();
  for (const auto& l : p.layers)
    layers.push_back({{"name", l.name},
                      {"forward_ms", times_to_json(l.forward_ms)},
                      {"backward_ms", times_to_json(l.backward_ms)},
                      {"param_bytes", l.param_bytes},
                      {"activation_bytes", l.activation_bytes},
                      {"output_bytes", l.output_bytes},
                      {"optimizer_ms", l.optimizer_ms}});
  root["layers"] = std::move(layers);
  if (p.link != planning::link_profile{})
    root["link"] = {{"latency_ms", p.link.latency_ms}, {"bytes_per_ms", p.link.bytes_per_ms}};
  return root;
}

std::string profile_json_text(const planning::profile& p, int indent) {
  // Names were validated as UTF-8 on the way in; a profile built in code is written, not refused.
  return profile_to_json(p).dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace oobleck::messages
