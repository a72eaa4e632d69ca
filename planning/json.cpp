#include "planning/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace oobleck::planning::json {

double value::as_number() const {
  if (is_integer()) return static_cast<double>(as_integer());
  return std::get<double>(v_);
}

const value* value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : as_object())
    if (k == key) return &v;
  return nullptr;
}

const char* value::type_name() const {
  if (is_null()) return "null";
  if (is_bool()) return "boolean";
  if (is_integer()) return "integer";
  if (is_number()) return "number";
  if (is_string()) return "string";
  if (is_array()) return "array";
  return "object";
}

namespace {

class parser {
 public:
  explicit parser(std::string_view text) : s_(text) {}

  value document() {
    value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) error("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    int line = 1, col = 1;
    for (std::size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw planning_error("JSON syntax error at line " + std::to_string(line) + " column " +
                         std::to_string(col) + ": " + what);
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) error(std::string("expected '") + c + "'");
  }

  value parse_value(int depth) {
    if (depth > 64) error("nesting deeper than 64 levels");
    skip_ws();
    if (pos_ >= s_.size()) error("unexpected end of input");
    char c = s_[pos_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return value(parse_string());
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (s_.substr(pos_, 4) == "true") return pos_ += 4, value(true);
    if (s_.substr(pos_, 5) == "false") return pos_ += 5, value(false);
    if (s_.substr(pos_, 4) == "null") return pos_ += 4, value(nullptr);
    error(std::string("unexpected character '") + c + "'");
  }

  value parse_object(int depth) {
    expect('{');
    object o;
    if (consume('}')) return value(std::move(o));
    do {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a string key");
      std::string key = parse_string();
      for (const auto& kv : o)
        if (kv.first == key) error("duplicate key \"" + key + "\"");
      expect(':');
      o.emplace_back(std::move(key), parse_value(depth + 1));
    } while (consume(','));
    expect('}');
    return value(std::move(o));
  }

  value parse_array(int depth) {
    expect('[');
    array a;
    if (consume(']')) return value(std::move(a));
    do {
      a.push_back(parse_value(depth + 1));
    } while (consume(','));
    expect(']');
    return value(std::move(a));
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) error("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) error("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': append_utf8(parse_hex4(), out); break;
        default: error(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > s_.size()) error("short \\u escape");
    unsigned cp = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= h - '0';
      else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
      else error("invalid hex digit in \\u escape");
    }
    return cp;
  }

  static void append_utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  value parse_number() {
    std::size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    bool integral = true;
    auto digits = [&] {
      std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) error("expected a digit");
    };
    digits();
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral = false;
      ++pos_;
      digits();
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
    std::string_view text = s_.substr(start, pos_ - start);
    if (integral) {
      std::int64_t i = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
      if (ec == std::errc() && ptr == text.data() + text.size()) return value(i);
    }
    double d = std::strtod(std::string(text).c_str(), nullptr);
    return value(d);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void dump_number(double d, std::string& out) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[32];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip form
  out.append(buf, ptr);
}

void dump_value(const value& v, int indent, int level, std::string& out) {
  auto newline = [&](int lvl) {
    if (indent <= 0) return;
    out.push_back('\n');
    out.append(static_cast<std::size_t>(indent * lvl), ' ');
  };
  if (v.is_null()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_integer()) {
    out += std::to_string(v.as_integer());
  } else if (v.is_number()) {
    dump_number(v.as_number(), out);
  } else if (v.is_string()) {
    dump_string(v.as_string(), out);
  } else if (v.is_array()) {
    const auto& a = v.as_array();
    out.push_back('[');
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (i) out.push_back(',');
      newline(level + 1);
      dump_value(a[i], indent, level + 1, out);
    }
    if (!a.empty()) newline(level);
    out.push_back(']');
  } else {
    const auto& o = v.as_object();
    out.push_back('{');
    for (std::size_t i = 0; i < o.size(); ++i) {
      if (i) out.push_back(',');
      newline(level + 1);
      dump_string(o[i].first, out);
      out += indent > 0 ? ": " : ":";
      dump_value(o[i].second, indent, level + 1, out);
    }
    if (!o.empty()) newline(level);
    out.push_back('}');
  }
}

}  // namespace

value parse(std::string_view text) { return parser(text).document(); }

std::string dump(const value& v, int indent) {
  std::string out;
  dump_value(v, indent, 0, out);
  return out;
}

}  // namespace oobleck::planning::json
