#include "bench/job_toml.hpp"

#include <toml++/toml.h>

#include <sstream>
#include <stdexcept>

namespace oobleck::bench {

std::string with_keys(const std::string& job_text, const std::vector<toml_key>& keys) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(job_text), std::string_view("job"));
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument("with_keys: the job is not TOML: " + std::string(e.description()));
  }
  for (const auto& k : keys) {
    if (!root.contains(k.section)) root.insert(k.section, toml::table{});
    auto* section = root[k.section].as_table();
    if (!section) throw std::invalid_argument("with_keys: [" + k.section + "] is not a table in the job");
    std::visit([&](const auto& v) { section->insert_or_assign(k.key, v); }, k.value);
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace oobleck::bench
