#include "bench/sim_validation_predict.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "bench/bench_text.hpp"
#include "sim/oobleck_policy.hpp"
#include "sim/simulator.hpp"

namespace oobleck::bench {

using json = nlohmann::ordered_json;

int validation_job::fault_tolerance(const replay_case& c) const {
  return c.fault_tolerance > 0 ? c.fault_tolerance : job.cluster.fault_tolerance;
}

planning::job_config validation_job::planner_config(int nodes, int fault_tolerance) const {
  return apps::planner_job(job, nodes, fault_tolerance);
}

sim::sim_job validation_job::sim_job_for(const replay_case& c, const std::vector<double>& step_scale) const {
  sim::sim_job sj;
  sj.profile = profile;
  sj.bamboo_profile = profile;
  sj.nodes = c.slots;
  sj.fault_tolerance = fault_tolerance(c);
  sj.checkpoint_folder = false;
  sj.global_batch = job.training.global_batch;
  sj.microbatch = job.training.microbatch;
  sj.bamboo_microbatch = job.training.microbatch;
  sj.step_scale = step_scale;
  return sj;
}

sim::cluster_trace cluster_trace_of(const replay_case& c, const sim::replay_schedule& s, double ready_ms) {
  return sim::to_cluster_trace(sim::replay_trace(s),
                               {.ready_delay_ms = ready_ms, .time_scale = c.scale, .initial_nodes_ready = true});
}

json predict_case(const validation_job& v, const replay_case& c, const measured_replay& m,
                  const std::vector<double>& step_scale, double join_ms, std::string& row) {
  // The same node subset, time scale and readiness delay; the measured costs and contention.
  const auto ct = cluster_trace_of(c, m.schedule, std::isnan(join_ms) ? 0 : join_ms);
  sim::oobleck_policy policy(v.sim_job_for(c, step_scale), v.costs, ct.start_ms);
  const auto p = sim::simulate(policy, ct, ct.start_ms + m.window_ms, c.slots);
  // The same without the contention model, for scale.
  sim::oobleck_policy plain(v.sim_job_for(c, {}), v.costs, ct.start_ms);
  const auto q = sim::simulate(plain, ct, ct.start_ms + m.window_ms, c.slots);
  const double error = (p.samples_per_s - m.measured) / m.measured;
  std::cout << "\n" << c.name << ": measured " << fmt("%.1f", m.measured) << " samples/s, predicted "
            << fmt("%.1f", p.samples_per_s) << ": error " << fmt("%+.1f", 100 * error)
            << "% (without the contention model: " << fmt("%.0f", q.samples_per_s) << " samples/s)\n";
  const double stopped_ms = p.breakdown_ms[static_cast<std::size_t>(sim::activity::stopped)];
  if (m.waits > 0 || m.resumes > 0 || stopped_ms > 0)
    std::cout << "  below the minimum: the coordinator waited " << m.waits << " time(s) and resumed " << m.resumes
              << " time(s), " << fmt("%.0f", m.waited_ms) << " ms waiting; the simulator waited "
              << fmt("%.0f", stopped_ms) << " ms\n";
  for (const auto& d : p.decisions)
    std::cout << "  sim " << fmt("%.2f", (d.ms - ct.start_ms) / 1000) << " s: " << d.what << " on " << d.nodes_in_use
              << " nodes, step " << fmt("%.1f", d.step_ms) << " ms" << (d.detail.empty() ? "" : " (" + d.detail + ")")
              << "\n";
  // Between consecutive events: measured against predicted throughput (where the error comes from).
  std::vector<double> cuts{0};
  for (const auto& e : m.schedule.events)
    if (e.ms < m.schedule.end_ms) cuts.push_back(e.ms * c.scale);
  cuts.push_back(m.window_ms);
  json phases = json::array();
  std::cout << "  phase (s here)      measured/s  predicted/s\n";
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    const double a = cuts[k], b = cuts[k + 1];
    if (!(b > a)) continue;
    double got = 0, want = 0;
    for (const auto& st : m.steps) {
      const double t = st["unix_ms"].get<double>() - m.t0;
      if (t > a && t <= b) got += st["samples"].get<double>();
    }
    for (const auto& seg : p.segments) {
      const double lo = std::max(a, seg.start_ms - ct.start_ms), hi = std::min(b, seg.end_ms - ct.start_ms);
      if (hi > lo && seg.end_ms > seg.start_ms) want += seg.samples * (hi - lo) / (seg.end_ms - seg.start_ms);
    }
    const double span_s = (b - a) / 1000;
    std::printf("  %6.1f - %6.1f %13.1f %12.1f\n", a / 1000, b / 1000, got / span_s, want / span_s);
    phases.push_back({{"from_s", a / 1000}, {"to_s", b / 1000}, {"measured_samples_per_s", got / span_s},
                      {"predicted_samples_per_s", want / span_s}});
  }
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %6d %8g %9.1f %7zu %11.1f %11.1f %+8.1f%%", c.name.c_str(), c.slots, c.scale,
                m.window_ms / 1000, m.replayed_events, m.measured, p.samples_per_s, 100 * error);
  row = line;
  json breakdown;
  for (int a = 0; a < sim::kActivities; ++a)
    breakdown[sim::to_string(static_cast<sim::activity>(a))] = p.breakdown_ms[static_cast<std::size_t>(a)];
  json recs = json::array();
  for (const auto& e : m.records) recs.push_back(json::parse(e.dump()));
  return {{"case", c.name},
          {"source", c.source},
          {"subset", c.how},
          {"slots", c.slots},
          {"time_scale", c.scale},
          {"window_s", m.window_ms / 1000},
          {"events", m.replayed_events},
          {"replayed", m.progress},
          {"measured_samples_per_s", m.measured},
          {"measured_samples", m.samples},
          {"fault_tolerance", v.fault_tolerance(c)},
          {"recovery_records", recs},
          {"measured_waits", m.waits},
          {"measured_resumes", m.resumes},
          {"measured_waited_ms", m.waited_ms},
          {"predicted_waited_ms", stopped_ms},
          {"predicted_samples_per_s", p.samples_per_s},
          {"relative_error", error},
          {"predicted_without_contention_model", q.samples_per_s},
          {"predicted_breakdown_ms", breakdown},
          {"phases", phases},
          {"load_average", {m.load_before, m.load_after}}};
}

}  // namespace oobleck::bench
