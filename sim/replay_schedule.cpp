#include "sim/replay_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>

#include "messages/input_error.hpp"

namespace oobleck::sim {

int replay_schedule::workers() const {
  int n = static_cast<int>(initial.size());
  for (const auto& e : events) n += static_cast<int>(e.started.size());
  return n;
}

replay_schedule make_replay_schedule(const std::vector<trace_event>& events, const replay_options& options) {
  if (options.slots < 1) throw messages::input_error("a trace replay needs at least 1 slot");
  if (events.empty()) throw messages::input_error("the trace has no events");
  replay_schedule s;
  const double first = events.front().ms;
  s.end_ms = events.back().ms - first;
  std::map<std::string, int> worker_of;  // trace node -> its worker, while it has one
  std::deque<std::string> spares;        // added, waiting for a slot
  int next_worker = 0;
  for (std::size_t i = 0; i < events.size();) {
    const double t = events[i].ms;
    replay_event e;
    e.ms = t - first;
    std::size_t end = i;
    while (end < events.size() && events[end].ms == t) ++end;
    for (std::size_t k = i; k < end; ++k)  // adds first (parse_trace puts them first at equal times)
      if (events[k].action == trace_action::add) {
        if (options.joins || t == first) spares.push_back(events[k].node);
        else ++s.adds_without_slot;
      }
    for (std::size_t k = i; k < end; ++k) {
      if (events[k].action != trace_action::remove) continue;
      const auto& name = events[k].node;
      if (const auto w = worker_of.find(name); w != worker_of.end()) {
        e.removed.push_back(name);
        e.killed.push_back(w->second);
        worker_of.erase(w);
      } else {
        if (const auto at = std::find(spares.begin(), spares.end(), name); at != spares.end()) {
          spares.erase(at);
          ++s.adds_without_slot;
        }
        ++s.removes_without_worker;
      }
    }
    while (static_cast<int>(worker_of.size()) < options.slots && !spares.empty()) {
      const std::string name = spares.front();
      spares.pop_front();
      worker_of[name] = next_worker;
      if (t == first) {
        s.initial.push_back(name);
      } else {
        e.added.push_back(name);
        e.started.push_back(next_worker);
      }
      ++next_worker;
    }
    if (t == first && !options.joins) {  // the rest of the starting nodes never get a worker
      s.adds_without_slot += static_cast<int>(spares.size());
      spares.clear();
    }
    if (!e.removed.empty() || !e.added.empty()) s.events.push_back(std::move(e));
    i = end;
  }
  s.adds_without_slot += static_cast<int>(spares.size());  // still waiting at the end
  return s;
}

std::vector<trace_event> replay_trace(const replay_schedule& schedule) {
  std::vector<trace_event> out;
  for (const auto& name : schedule.initial) out.push_back({0, trace_action::add, name, 0});
  for (const auto& e : schedule.events) {
    for (const auto& name : e.added) out.push_back({e.ms, trace_action::add, name, 0});
    for (const auto& name : e.removed) out.push_back({e.ms, trace_action::remove, name, 0});
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].line = static_cast<int>(i) + 1;
  return out;
}

std::string describe(const replay_event& e) {
  std::string s = "trace " + std::to_string(static_cast<long long>(std::llround(e.ms / 1000))) + " s:";
  for (std::size_t i = 0; i < e.removed.size(); ++i)
    s += " remove " + e.removed[i] + " (kill worker " + std::to_string(e.killed[i]) + ");";
  for (std::size_t i = 0; i < e.added.size(); ++i)
    s += " add " + e.added[i] + " (start worker " + std::to_string(e.started[i]) + ");";
  if (s.back() == ';') s.pop_back();
  return s;
}

}  // namespace oobleck::sim
