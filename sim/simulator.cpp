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
  for (const auto& change : trace.changes) {
    if (change.ms >= end_ms) break;
    if (change.ms < start) continue;
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
  return r;
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
