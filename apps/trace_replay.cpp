#include "apps/trace_replay.hpp"

#include <cstdio>

#include "messages/input_error.hpp"

namespace oobleck::apps {

trace_replayer::trace_replayer(const std::string& path, int slots, double time_scale)
    : schedule_(sim::make_replay_schedule(sim::read_trace(path), {.slots = slots, .joins = true})), scale_(time_scale) {
  if (!(time_scale > 0)) throw messages::input_error("--time-scale must be > 0");
}

void trace_replayer::begin(clock::time_point t0) {
  t0_ = t0;
  begun_ = true;
}

trace_replayer::clock::time_point trace_replayer::at(double trace_ms) const {
  return t0_ + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::milli>(trace_ms * scale_));
}

std::vector<sim::replay_event> trace_replayer::due(clock::time_point now) {
  std::vector<sim::replay_event> out;
  if (!begun_) return out;
  // Events at the trace's last time are not replayed: the run ends there (as the simulator
  // ignores changes at its end).
  for (; next_ < schedule_.events.size() && schedule_.events[next_].ms < schedule_.end_ms &&
         at(schedule_.events[next_].ms) <= now;
       ++next_)
    out.push_back(schedule_.events[next_]);
  return out;
}

bool trace_replayer::ended(clock::time_point now) const { return begun_ && now >= at(schedule_.end_ms); }

std::string trace_replayer::summary(const std::string& path) const {
  const auto& s = schedule_;
  std::string map;
  for (std::size_t i = 0; i < s.initial.size(); ++i) map += (i ? ", " : "") + s.initial[i] + " -> worker " + std::to_string(i);
  int kills = 0, starts = 0;
  for (const auto& e : s.events) {
    if (e.ms >= s.end_ms) continue;  // the run ends there
    kills += static_cast<int>(e.killed.size());
    starts += static_cast<int>(e.started.size());
  }
  char window[96];
  std::snprintf(window, sizeof window, "%.0f s of trace = %.1f s here (x%g)", s.end_ms / 1000, s.end_ms * scale_ / 1000,
                scale_);
  return "replaying " + path + ": " + map + "; " + std::to_string(kills) + " kill(s), " + std::to_string(starts) +
         " worker start(s) (joins); " + std::to_string(s.adds_without_slot) + " node(s) of the trace never get a worker; " +
         window + " from the first epoch";
}

}  // namespace oobleck::apps
