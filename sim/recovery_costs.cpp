#include "sim/recovery_costs.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "messages/input_error.hpp"

namespace oobleck::sim {

using messages::input_error;

recovery_costs parse_recovery_costs(const std::string& text, const std::string& name) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw input_error(name + ": not JSON: " + e.what());
  }
  if (!doc.is_object()) throw input_error(name + ": expected a JSON object");
  recovery_costs c;
  c.source = name;
  auto number = [&](const std::string& key, const nlohmann::json& v, double min, bool strict) {
    if (!v.is_number()) throw input_error(name + ": " + key + " must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < min || (strict && x <= min))
      throw input_error(name + ": " + key + " must be " + (strict ? "> " : ">= ") + std::to_string(min));
    return x;
  };
  const std::map<std::string, std::function<void(const nlohmann::json&)>> fields = {
      {"detection_ms", [&](const auto& v) { c.detection_ms = number("detection_ms", v, 0, false); }},
      {"planning_ms", [&](const auto& v) { c.planning_ms = number("planning_ms", v, 0, false); }},
      {"copy_bytes_per_s", [&](const auto& v) { c.copy_bytes_per_s = number("copy_bytes_per_s", v, 0, true); }},
      {"checkpoint_fixed_ms", [&](const auto& v) { c.checkpoint_fixed_ms = number("checkpoint_fixed_ms", v, 0, false); }},
      {"storage_bytes_per_s", [&](const auto& v) { c.storage_bytes_per_s = number("storage_bytes_per_s", v, 0, true); }},
      {"restart_fixed_ms", [&](const auto& v) { c.restart_fixed_ms = number("restart_fixed_ms", v, 0, false); }},
      {"load_bytes_per_s", [&](const auto& v) { c.load_bytes_per_s = number("load_bytes_per_s", v, 0, true); }},
      {"varuna_checkpoint_every_steps",
       [&](const auto& v) {
         if (!v.is_number_integer() || v.template get<long long>() < 1 || v.template get<long long>() > 1000000)
           throw input_error(name + ": varuna_checkpoint_every_steps must be an integer in [1, 1000000]");
         c.varuna_checkpoint_every_steps = v.template get<int>();
       }},
      {"bamboo_redundancy_factor",
       [&](const auto& v) { c.bamboo_redundancy_factor = number("bamboo_redundancy_factor", v, 0, false); }},
      {"bamboo_takeover_ms", [&](const auto& v) { c.bamboo_takeover_ms = number("bamboo_takeover_ms", v, 0, false); }},
      {"source",
       [&](const auto& v) {
         if (!v.is_string()) throw input_error(name + ": source must be a string");
         c.source = name + " (" + v.template get<std::string>() + ")";
       }},
      {"measured", [](const auto&) {}},
  };
  for (const auto& [key, value] : doc.items()) {
    const auto it = fields.find(key);
    if (it == fields.end()) throw input_error(name + ": unknown key '" + key + "'");
    it->second(value);
  }
  return c;
}

recovery_costs read_recovery_costs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read recovery-costs file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_recovery_costs(text.str(), path);
}

}  // namespace oobleck::sim
