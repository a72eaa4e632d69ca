#include "bench/sim_validation_cases.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <stdexcept>
#include <vector>

#include "bench/bench_text.hpp"
#include "sim/trace.hpp"

namespace oobleck::bench {

namespace fs = std::filesystem;

namespace {

void write_trace(const fs::path& path, const std::vector<sim::trace_event>& events) {
  std::ofstream out(path);
  for (const auto& e : events)
    out << static_cast<long long>(std::llround(e.ms)) << "," << (e.action == sim::trace_action::add ? "add" : "remove")
        << "," << e.node << "\n";
}

}  // namespace

replay_case ten_minute_case(const fs::path& traces, const fs::path& dir, int removed, int kept, double scale) {
  const auto events = sim::read_trace((traces / "10m.csv").string());
  std::vector<std::string> removal_order;
  std::set<std::string> ever_removed;
  for (const auto& e : events)
    if (e.action == sim::trace_action::remove) {
      removal_order.push_back(e.node);
      ever_removed.insert(e.node);
    }
  if (static_cast<int>(removal_order.size()) <= removed) throw std::runtime_error("10m.csv has too few removals");
  std::set<std::string> subset(removal_order.begin(), removal_order.begin() + removed);
  const std::string end_node = removal_order[static_cast<std::size_t>(removed)];
  int k = 0;
  for (const auto& e : events)
    if (e.action == sim::trace_action::add && !ever_removed.count(e.node) && k < kept && subset.insert(e.node).second) ++k;
  std::vector<sim::trace_event> out;
  double end_ms = 0;
  for (const auto& e : events) {
    if (e.action == sim::trace_action::remove && e.node == end_node) {
      end_ms = e.ms;
      break;
    }
    if (subset.count(e.node)) out.push_back(e);
  }
  // The end: the time of the trace's next removal, marked by an add (any event would do: the run
  // ends at the trace's last time, and what happens then is not replayed, nor simulated).
  out.push_back({end_ms, sim::trace_action::add, "end-of-window", 0});
  replay_case c;
  c.name = "10m.csv subset";
  c.source = (traces / "10m.csv").string();
  c.how = "the first " + std::to_string(removed) + " nodes 10m.csv removes and " + std::to_string(kept) +
          " it never removes (file order); the window ends at its next removal (" + end_node + ", " +
          fmt("%.0f", end_ms / 1000) + " s)";
  c.trace = dir / "10m-subset.csv";
  c.slots = removed + kept;
  c.scale = scale;
  write_trace(c.trace, out);
  return c;
}

replay_case synthetic_case(const fs::path& dir, double scale) {
  std::vector<sim::trace_event> out;
  for (int i = 1; i <= 6; ++i) out.push_back({0, sim::trace_action::add, "node" + std::to_string(i), 0});
  out.push_back({601200, sim::trace_action::remove, "node2", 0});
  out.push_back({1202400, sim::trace_action::remove, "node5", 0});
  out.push_back({1803600, sim::trace_action::add, "end-of-window", 0});
  replay_case c;
  c.name = "synthetic";
  c.source = "written by sim_validation (no traces folder)";
  c.how = "6 nodes, 2 removed 601.2 s apart (10m.csv's spacing), the window ending at 1803.6 s";
  c.trace = dir / "synthetic.csv";
  c.slots = 6;
  c.scale = scale;
  write_trace(c.trace, out);
  return c;
}

replay_case bamboo_case(const fs::path& traces, const fs::path& dir, int slots, double until_ms, double scale) {
  const auto events = sim::read_trace((traces / "bamboo-p3-trace.csv").string());
  std::vector<sim::trace_event> out;
  for (const auto& e : events)
    if (e.ms <= until_ms) out.push_back(e);
  replay_case c;
  c.name = "bamboo-p3 (adds as joins)";
  c.source = (traces / "bamboo-p3-trace.csv").string();
  c.how = "its events up to " + fmt("%.0f", out.back().ms / 1000) + " s, on " + std::to_string(slots) +
          " slots (spares join when a slot frees)";
  c.trace = dir / "bamboo-window.csv";
  c.slots = slots;
  c.scale = scale;
  write_trace(c.trace, out);
  return c;
}

replay_case bamboo_window_case(const fs::path& traces, const fs::path& dir, int slots, double from_ms,
                               double until_ms, double scale, int fault_tolerance) {
  const auto events = sim::read_trace((traces / "bamboo-p3-trace.csv").string());
  std::vector<std::string> present;  // at from_ms, in the order they were added
  std::vector<sim::trace_event> out;
  for (const auto& e : events) {
    if (e.ms <= from_ms) {
      if (e.action == sim::trace_action::add) present.push_back(e.node);
      else std::erase(present, e.node);
    } else if (e.ms <= until_ms) {
      out.push_back({e.ms - from_ms, e.action, e.node, e.line});
    }
  }
  if (present.empty() || out.empty()) throw std::runtime_error("bamboo-p3-trace.csv: nothing in the window");
  std::vector<sim::trace_event> window;
  for (const auto& name : present) window.push_back({0, sim::trace_action::add, name, 0});
  window.insert(window.end(), out.begin(), out.end());
  replay_case c;
  c.name = "bamboo-p3 mass preemption";
  c.source = (traces / "bamboo-p3-trace.csv").string();
  c.how = "its nodes present at " + fmt("%.0f", from_ms / 1000) + " s and its events up to " +
          fmt("%.0f", (from_ms + out.back().ms) / 1000) + " s, on " + std::to_string(slots) + " slots with f = " +
          std::to_string(fault_tolerance) + " (spares join when a slot frees)";
  c.trace = dir / "bamboo-mass-preemption.csv";
  c.slots = slots;
  c.scale = scale;
  c.fault_tolerance = fault_tolerance;
  write_trace(c.trace, window);
  return c;
}

}  // namespace oobleck::bench
