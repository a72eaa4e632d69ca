#include "messages/event_json.hpp"

#include <chrono>

#include "messages/input_error.hpp"
#include "messages/protocol.hpp"

namespace oobleck::messages {

namespace {

constexpr event_kind all_kinds[] = {event_kind::node_joined,    event_kind::node_lost,          event_kind::epoch_formed,
                                    event_kind::step_committed, event_kind::stopped,            event_kind::epoch_forming,
                                    event_kind::commit_stood,   event_kind::step_failed,        event_kind::checkpoint_written,
                                    event_kind::node_refused,   event_kind::waiting_for_nodes,  event_kind::resumed};
constexpr stop_outcome all_outcomes[] = {stop_outcome::none, stop_outcome::finished, stop_outcome::shutdown,
                                         stop_outcome::failed, stop_outcome::checkpoint_and_stop,
                                         stop_outcome::superseded};

}  // namespace

std::optional<event_kind> event_kind_named(std::string_view name) {
  for (auto k : all_kinds)
    if (to_string(k) == name) return k;
  return std::nullopt;
}

nlohmann::ordered_json event_json(const timed_event& t) {
  const auto& e = t.event;
  nlohmann::ordered_json j;
  j["event"] = to_string(e.kind);
  j["unix_ms"] = t.unix_ms;
  j["epoch"] = e.epoch;
  j["step"] = e.step;
  j["node"] = e.node;
  j["loss"] = static_cast<double>(e.loss);
  j["detail"] = e.detail;
  j["lost"] = e.lost;
  j["joined"] = e.joined;
  j["outcome"] = to_string(e.outcome);
  j["committed"] = e.committed;
  return j;
}

std::optional<timed_event> parse_event_line(std::string_view line) {
  if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) return std::nullopt;
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("event") || !j["event"].is_string()) return std::nullopt;
  const auto kind = event_kind_named(j["event"].get<std::string>());
  if (!kind) return std::nullopt;  // another record ("reconfigured", a step record's file...)
  try {
    timed_event t;
    t.event.kind = *kind;
    t.unix_ms = j.at("unix_ms").get<double>();
    t.event.epoch = j.at("epoch").get<std::uint64_t>();
    t.event.step = j.at("step").get<std::uint64_t>();
    t.event.node = j.at("node").get<std::int64_t>();
    t.event.loss = j.at("loss").get<double>();
    t.event.detail = j.at("detail").get<std::string>();
    t.event.lost = j.at("lost").get<std::vector<std::int64_t>>();
    t.event.joined = j.at("joined").get<std::vector<std::int64_t>>();
    const auto outcome = j.at("outcome").get<std::string>();
    bool known = false;
    for (auto o : all_outcomes)
      if (to_string(o) == outcome) t.event.outcome = o, known = true;
    if (!known) throw input_error("unknown outcome '" + outcome + "'");
    t.event.committed = j.at("committed").get<std::uint64_t>();
    return t;
  } catch (const input_error& e) {
    throw input_error("event line: " + std::string(e.what()) + ": " + std::string(line));
  } catch (const std::exception& e) {
    throw input_error("event line: " + std::string(e.what()) + ": " + std::string(line));
  }
}

void take_complete_events(std::string& buffer, std::vector<timed_event>& out) {
  std::size_t begin = 0;
  try {
    for (std::size_t end; (end = buffer.find('\n', begin)) != std::string::npos;) {
      const auto line = std::string_view(buffer).substr(begin, end - begin);
      begin = end + 1;  // consumed, event or not, parsed or refused
      if (auto e = parse_event_line(line)) out.push_back(std::move(*e));
    }
  } catch (const input_error&) {
    buffer.erase(0, begin);
    throw;
  }
  buffer.erase(0, begin);
}

double unix_ms_now() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace oobleck::messages
