#include "messages/strict_json.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace oobleck::messages::json {

namespace {

using nlohmann::json;

std::string key_text(std::string_view s) {
  // Keys come from the lexer (valid UTF-8); replace anyway rather than throw inside an error.
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

bool is_identifier(std::string_view key) {
  if (key.empty() || (key[0] >= '0' && key[0] <= '9')) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Tracks where the parser is, so a duplicate key or an over-deep value can be named by its path.
class path_tracker {
 public:
  explicit path_tracker(std::string root) : root_(std::move(root)) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    if (event != json::parse_event_t::key && event != json::parse_event_t::object_end &&
        event != json::parse_event_t::array_end && ++values_ > max_values)
      throw input_error(path() + ": more than " + std::to_string(max_values) + " values");
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (frames_.size() >= static_cast<std::size_t>(max_depth))
          throw input_error(path() + ": nesting deeper than " + std::to_string(max_depth) + " levels");
        frames_.push_back({event == json::parse_event_t::array_start, 0, {}, {}});
        break;
      case json::parse_event_t::key: {
        auto& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) throw input_error(path() + ": duplicate key " + key_text(f.key));
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        element_done();
        break;
      case json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  }

 private:
  struct frame {
    bool is_array;
    std::size_t index;  // of the element being parsed, in an array
    std::string key;    // being parsed, in an object
    std::unordered_set<std::string> keys;
  };

  void element_done() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().index;
  }

  std::string path() const {
    std::string p = root_;
    for (const auto& f : frames_) p = f.is_array ? p + "[" + std::to_string(f.index) + "]" : member_path(p, f.key);
    return p;
  }

  std::string root_;
  std::vector<frame> frames_;
  std::size_t values_ = 0;
};

// "[json.exception.parse_error.101] parse error at line 3, column 17: syntax error ..." becomes
// "JSON syntax error at line 3 column 17: syntax error ...".
std::string describe(const json::exception& e) {
  std::string what = e.what();
  if (const auto close = what.find("] "); what.rfind("[json.exception.", 0) == 0 && close != std::string::npos)
    what.erase(0, close + 2);
  const std::string prefix = "parse error at line ";
  if (what.rfind(prefix, 0) == 0) {
    what.replace(0, prefix.size(), "JSON syntax error at line ");
    if (const auto comma = what.find(", column "); comma != std::string::npos) what.erase(comma, 1);
    return what;
  }
  if (what.rfind("parse error", 0) == 0) return "JSON syntax error: " + what;
  return "invalid JSON: " + what;
}

}  // namespace

std::string member_path(const std::string& parent, std::string_view key) {
  return is_identifier(key) ? parent + "." + std::string(key) : parent + "[" + key_text(key) + "]";
}

json parse_strict(std::string_view text, const std::string& root) {
  path_tracker tracker(root);
  try {
    return json::parse(
        text.begin(), text.end(), [&](int, json::parse_event_t event, json& parsed) { return tracker.on_event(event, parsed); },
        /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw input_error(root + ": " + describe(e));
  }
}

void node::fail(const std::string& what) const { throw input_error(path_ + ": " + what); }

void node::expect_keys(std::initializer_list<std::string_view> known) const {
  if (!v_->is_object()) fail(std::string("expected an object, got ") + v_->type_name());
  for (const auto& [key, _] : v_->items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string list;
    for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    fail("unknown key " + key_text(key) + " (known keys: " + list + ")");
  }
}

node node::member(std::string_view key) const {
  auto m = optional_member(key);
  if (!m) fail("missing key " + key_text(key));
  return *m;
}

std::optional<node> node::optional_member(std::string_view key) const {
  if (!v_->is_object()) fail(std::string("expected an object, got ") + v_->type_name());
  const auto it = v_->find(key);
  if (it == v_->end()) return std::nullopt;
  return node(*it, member_path(path_, key));
}

std::vector<node> node::elements() const {
  if (!v_->is_array()) fail(std::string("expected an array, got ") + v_->type_name());
  std::vector<node> out;
  out.reserve(v_->size());
  for (std::size_t i = 0; i < v_->size(); ++i) out.emplace_back((*v_)[i], path_ + "[" + std::to_string(i) + "]");
  return out;
}

std::vector<std::pair<std::string, node>> node::members() const {
  if (!v_->is_object()) fail(std::string("expected an object, got ") + v_->type_name());
  std::vector<std::pair<std::string, node>> out;
  out.reserve(v_->size());
  for (const auto& [key, value] : v_->items()) out.emplace_back(key, node(value, member_path(path_, key)));
  return out;
}

std::string node::as_string() const {
  if (!v_->is_string()) fail(std::string("expected a string, got ") + v_->type_name());
  return v_->get<std::string>();
}

std::int64_t node::as_integer() const {
  if (v_->is_number_unsigned()) {
    const auto u = v_->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(std::to_string(u) + " is out of range (at most " + std::to_string(std::numeric_limits<std::int64_t>::max()) + ")");
    return static_cast<std::int64_t>(u);
  }
  if (v_->is_number_integer()) return v_->get<std::int64_t>();
  if (v_->is_number_float()) {
    const double d = v_->get<double>();
    constexpr double exact = 9007199254740992.0;  // 2^53: every integer below is exact in a double
    if (d != std::floor(d)) fail("expected an integer, got " + v_->dump());
    if (std::fabs(d) >= exact) fail(v_->dump() + " is out of range for an integer written as a float (below 2^53)");
    return static_cast<std::int64_t>(d);
  }
  fail(std::string("expected an integer, got ") + v_->type_name());
}

double node::as_number() const {
  if (!v_->is_number()) fail(std::string("expected a number, got ") + v_->type_name());
  return v_->get<double>();
}

}  // namespace oobleck::messages::json
