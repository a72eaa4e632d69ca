#include "sim/simulator.hpp"

#include <algorithm>
#include <deque>
#include <set>

namespace oobleck::sim {

policy_result simulate(policy& p, const cluster_trace& trace, double end_ms, int max_nodes) {
  auto& clock = p.clock();
  const double start = clock.now();
  std::set<int> granted;
  std::deque<int> spares;
  // The policy's own timers that fall before `t` (and before the end), in order.
  auto run_timers = [&](double t) {
    for (double at = p.next_timer_ms(); at < t && at < end_ms; at = p.next_timer_ms()) {
      clock.advance_to(std::max(at, clock.now()));
      p.on_timer();
    }
  };
  for (const auto& change : trace.changes) {
    if (change.ms >= end_ms) break;
    if (change.ms < start) continue;
    run_timers(change.ms);
    clock.advance_to(change.ms);
    // A node ready and removed at the same time is never seen.
    std::set<int> gone(change.removed.begin(), change.removed.end());
    std::vector<int> removed, ready;
    for (int n : change.ready) {
      if (gone.erase(n)) continue;
      spares.push_back(n);
    }
    for (int n : gone) {
      if (granted.erase(n)) removed.push_back(n);
      else spares.erase(std::remove(spares.begin(), spares.end(), n), spares.end());
    }
    while (static_cast<int>(granted.size()) < max_nodes && !spares.empty()) {
      ready.push_back(spares.front());
      granted.insert(spares.front());
      spares.pop_front();
    }
    if (!ready.empty() || !removed.empty()) p.on_change(ready, removed);
  }
  run_timers(end_ms);
  clock.advance_to(std::max(end_ms, clock.now()));
  clock.close();
  policy_result r;
  r.policy = p.name();
  r.start_ms = start;
  r.end_ms = clock.now();
  r.samples = clock.samples();
  r.samples_per_s = r.end_ms > r.start_ms ? r.samples / (r.end_ms - r.start_ms) * 1e3 : 0;
  r.breakdown_ms = clock.breakdown();
  r.segments = clock.segments();
  r.decisions = p.decisions();
  r.never_runs = p.never_runs();
  for (const auto& d : r.decisions)
    if (d.what == "start" && d.step_ms > 0) {
      r.failure_free_samples_per_s = d.samples_per_step / d.step_ms * 1e3;
      break;
    }
  return r;
}

double effective_share(const policy_result& r) {
  const double wall = r.end_ms - r.start_ms;
  if (!(r.failure_free_samples_per_s > 0) || !(wall > 0)) return 0;
  return r.samples / (r.failure_free_samples_per_s * wall / 1e3);
}

time_lost lost_time(const policy_result& r) {
  time_lost t;
  const auto& b = r.breakdown_ms;
  t.fallback = b[static_cast<int>(activity::fallback)];
  t.reconfiguration = b[static_cast<int>(activity::reconfiguration)];
  t.checkpoint = b[static_cast<int>(activity::checkpoint)];
  t.restart = b[static_cast<int>(activity::restart)];
  t.stopped = b[static_cast<int>(activity::stopped)];
  t.redundant = b[static_cast<int>(activity::redundant)];
  t.effective = r.failure_free_samples_per_s > 0 ? r.samples / r.failure_free_samples_per_s * 1e3 : 0;
  t.slower = b[static_cast<int>(activity::effective)] - t.effective;
  return t;
}

std::vector<double> throughput_series(const policy_result& r, int bins) {
  std::vector<double> samples(std::max(bins, 1), 0.0);
  const double span = r.end_ms - r.start_ms;
  if (!(span > 0)) return samples;
  const double width = span / samples.size();
  for (const auto& s : r.segments) {
    if (s.samples <= 0 || !(s.end_ms > s.start_ms)) continue;
    const double density = s.samples / (s.end_ms - s.start_ms);
    auto first = static_cast<std::size_t>(std::max(0.0, (s.start_ms - r.start_ms) / width));
    for (std::size_t i = first; i < samples.size(); ++i) {
      const double lo = r.start_ms + i * width, hi = lo + width;
      if (lo >= s.end_ms) break;
      const double overlap = std::min(hi, s.end_ms) - std::max(lo, s.start_ms);
      if (overlap > 0) samples[i] += density * overlap;
    }
  }
  for (double& x : samples) x = x / width * 1e3;
  return samples;
}

}  // namespace oobleck::sim
