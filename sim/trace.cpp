#include "sim/trace.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "messages/input_error.hpp"

namespace oobleck::sim {

using messages::input_error;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string shown(std::string_view line) {
  constexpr std::size_t kMax = 60;
  std::string s(line.substr(0, kMax));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return line.size() > kMax ? s + "..." : s;
}

trace_event parse_line(std::string_view line, int number, const std::string& where) {
  auto fail = [&](const std::string& why) -> trace_event {
    throw input_error(where + " line " + std::to_string(number) + ": " + why + " (expected 'ms,add|remove,node', got '" +
                      shown(line) + "')");
  };
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const auto comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (fields.size() != 3) return fail(std::to_string(fields.size()) + " fields");
  trace_event e;
  e.line = number;
  std::int64_t ms = 0;
  const auto [ptr, ec] = std::from_chars(fields[0].data(), fields[0].data() + fields[0].size(), ms);
  if (ec == std::errc::result_out_of_range) return fail("time out of range");
  if (ec != std::errc() || ptr != fields[0].data() + fields[0].size() || fields[0].empty())
    return fail("time is not an integer number of milliseconds");
  if (ms < 0) return fail("negative time " + std::to_string(ms));
  if (ms > (std::int64_t{1} << 53)) return fail("time out of range");
  e.ms = static_cast<double>(ms);
  if (fields[1] == "add") e.action = trace_action::add;
  else if (fields[1] == "remove") e.action = trace_action::remove;
  else return fail("unknown action '" + shown(fields[1]) + "'");
  if (fields[2].empty()) return fail("empty node name");
  e.node = std::string(fields[2]);
  return e;
}

}  // namespace

std::vector<trace_event> parse_trace(std::string_view text, const std::string& name) {
  std::vector<trace_event> events;
  int number = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    const auto nl = text.find('\n', start);
    const auto line = text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    ++number;
    start = nl == std::string_view::npos ? text.size() : nl + 1;
    if (trim(line).empty()) continue;
    events.push_back(parse_line(line, number, name));
  }
  std::stable_sort(events.begin(), events.end(), [](const trace_event& a, const trace_event& b) {
    if (a.ms != b.ms) return a.ms < b.ms;
    return a.action == trace_action::add && b.action == trace_action::remove;
  });
  std::set<std::string> present;
  for (const auto& e : events) {
    const std::string at = name + " line " + std::to_string(e.line) + ": ";
    if (e.action == trace_action::add && !present.insert(e.node).second)
      throw input_error(at + "node '" + e.node + "' is added at " + std::to_string(static_cast<std::int64_t>(e.ms)) +
                        " ms while it is already present");
    if (e.action == trace_action::remove && present.erase(e.node) == 0)
      throw input_error(at + "node '" + e.node + "' is removed at " + std::to_string(static_cast<std::int64_t>(e.ms)) +
                        " ms but is not present (never added, or already removed)");
  }
  return events;
}

std::vector<trace_event> read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read trace file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw input_error("cannot read trace file " + path);
  return parse_trace(text.str(), path);
}

cluster_trace to_cluster_trace(const std::vector<trace_event>& events, const trace_options& options) {
  if (!(options.time_scale > 0)) throw input_error("time scale must be > 0");
  if (!(options.ready_delay_ms >= 0)) throw input_error("ready delay must be >= 0");
  cluster_trace out;
  if (events.empty()) return out;
  const double first = events.front().ms;
  out.start_ms = first * options.time_scale;
  out.end_ms = events.back().ms * options.time_scale;
  // Readiness and removal, keyed by time; at equal times readiness comes first (adds before removes).
  std::map<double, cluster_change> by_time;
  std::map<std::string, int> live_id;  // present in the trace
  std::map<int, double> ready_at;      // id -> when it becomes ready
  for (const auto& e : events) {
    const double t = e.ms * options.time_scale;
    if (e.action == trace_action::add) {
      const int id = static_cast<int>(out.names.size());
      out.names.push_back(e.node);
      live_id[e.node] = id;
      const bool initial = options.initial_nodes_ready && e.ms == first;
      ready_at[id] = initial ? t : t + options.ready_delay_ms;
    } else {
      const int id = live_id.at(e.node);
      live_id.erase(e.node);
      const double ready = ready_at.at(id);
      ready_at.erase(id);
      if (ready > t) continue;  // removed before it was ever ready: the job never sees it
      auto& c = by_time[ready];
      c.ms = ready;
      c.ready.push_back(id);
      auto& r = by_time[t];
      r.ms = t;
      r.removed.push_back(id);
    }
  }
  for (const auto& [id, ready] : ready_at) {  // never removed
    auto& c = by_time[ready];
    c.ms = ready;
    c.ready.push_back(id);
  }
  int alive = 0;
  for (auto& [t, c] : by_time) {
    std::sort(c.ready.begin(), c.ready.end());
    alive += static_cast<int>(c.ready.size());
    out.most_alive = std::max(out.most_alive, alive);
    alive -= static_cast<int>(c.removed.size());
    out.changes.push_back(std::move(c));
  }
  return out;
}

}  // namespace oobleck::sim
