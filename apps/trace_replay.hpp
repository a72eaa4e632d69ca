#pragma once
// oobleck-local --trace: a node availability trace replayed on the local cluster in real time
// (scaled). The schedule (sim/replay_schedule.hpp) says which workers exist from the start and
// which are killed or started when; this clock says when each event is due: trace time 0 is the
// moment the job's first epoch formed, and trace time t is t x time_scale later.

#include <chrono>
#include <string>
#include <vector>

#include "sim/replay_schedule.hpp"

namespace oobleck::apps {

class trace_replayer {
 public:
  using clock = std::chrono::steady_clock;

  /// Reads the trace (messages::input_error for an unreadable file or a bad line, naming it) and
  /// schedules it on `slots` workers. time_scale > 0.
  trace_replayer(const std::string& path, int slots, double time_scale);

  const sim::replay_schedule& schedule() const { return schedule_; }
  double time_scale() const { return scale_; }

  /// Trace time 0 is t0 from now on.
  void begin(clock::time_point t0);
  bool begun() const { return begun_; }
  /// The events due by `now` that were not returned before, in order (none before begin(); none
  /// at the trace's last time, where the run ends).
  std::vector<sim::replay_event> due(clock::time_point now);
  /// Whether `now` is at or past the trace's last time (scaled); false before begin().
  bool ended(clock::time_point now) const;

  /// Where an event falls in local time: seconds after trace time 0.
  double local_s(const sim::replay_event& e) const { return e.ms * scale_ / 1000; }
  /// One line saying what will be replayed (the node mapping, the counts, the window).
  std::string summary(const std::string& path) const;

 private:
  clock::time_point at(double trace_ms) const;

  sim::replay_schedule schedule_;
  double scale_;
  bool begun_ = false;
  clock::time_point t0_{};
  std::size_t next_ = 0;
};

}  // namespace oobleck::apps
