#include "bench/recovery_report.hpp"

#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>

#include "bench/bench_text.hpp"
#include "bench/recovery_plan.hpp"

namespace oobleck::bench {

void print_fault_tables(const std::vector<fault_result>& results) {
  std::cout << "\nper fault (ms unless stated; detect: fault -> the coordinator's first failure notice event, unix ms;\n"
               "decide, copy, downtime: the coordinator's record; GB/s: the busiest link's bytes / copy; step: failure-free commit interval before it)\n";
  std::printf("%-28s %-8s %-14s %4s %7s %8s %8s %7s %10s %7s %8s %8s %9s %6s %7s\n", "scenario", "job", "fault", "node",
              "step", "detect", "lost", "decide", "copy B", "copy", "GB/s", "resume", "downtime", "steps", "bound");
  for (const auto& r : results) {
    const double copy_ms = record_ms(r, "copy_ms"), down = record_ms(r, "downtime_ms");
    const double bytes = r.record.is_null() ? NAN : r.record["copy_bytes"].get<double>();
    const double bound = downtime_bound_ms(r);
    const std::string gbps = r.busiest_bytes > 0 ? fmt("%.3f", busiest_gbps(r)) : "-";
    std::printf("%-28s %-8s %-14s %4d %7.1f %8.1f %8.1f %7.3f %10.0f %7.1f %8s %8.1f %9.1f %6.2f %7s\n",
                r.scenario.c_str(), r.job.c_str(), r.kind.c_str(), r.node, r.step_ms, r.detect_ms, r.loss_notice_ms,
                record_ms(r, "plan_ms"), bytes, copy_ms, gbps.c_str(), r.resume_ms, down, down / r.step_ms,
                down <= bound ? "met" : "MISSED");
  }

  std::cout << "\nwhere the copies go (ms, the coordinator's record; each the slowest node's): copy = copy_ms (the time\n"
               "during which one of the node's links was copying: each from the receiver's ready, sent as soon as that link is\n"
               "up, to the source's last message arrived; plus installing); wait = the longest ready -> first message of a\n"
               "source (senders' skew); rest = copy - wait; GB/s: the busiest link's bytes / copy; all: every link's bytes /\n"
               "copy (the links share this machine's two cores); p2p: the host transport's p2p GB/s for one message of the\n"
               "busiest link's bytes (links of 1 MiB or more), measured after the scenarios on idle cores; /p2p: GB/s over it;\n"
               "connect = the whole mesh; prepare = allocating and pre-faulting the incoming layers (before the mesh\n"
               "connects); wk = the workers left after the fault\n";
  std::printf("%-28s %-8s %4s %3s %10s %10s %7s %7s %7s %8s %8s %6s %6s %8s %8s\n", "scenario", "job", "node", "wk",
              "copy B", "busiest B", "copy", "wait", "rest", "GB/s", "all", "p2p", "/p2p", "connect", "prepare");
  for (const auto& r : results) {
    if (r.record.is_null()) continue;
    const double copy_ms = record_ms(r, "copy_ms"), wait_ms = record_ms(r, "copy_wait_ms");
    const double bytes = r.record["copy_bytes"].get<double>();
    const std::string gbps = r.busiest_bytes > 0 ? fmt("%.3f", busiest_gbps(r)) : "-";
    const std::string all = bytes > 0 && copy_ms > 0 ? fmt("%.3f", all_links_gbps(r)) : "-";
    const bool referenced = r.busiest_bytes > 0 && r.p2p_gb_per_s > 0;
    const std::string p2p = referenced ? fmt("%.2f", r.p2p_gb_per_s) : "-";
    const std::string ratio = referenced ? fmt("%.2f", busiest_gbps(r) / r.p2p_gb_per_s) : "-";
    std::printf("%-28s %-8s %4d %3d %10.0f %10lld %7.1f %7.1f %7.1f %8s %8s %6s %6s %8.1f %8.1f\n", r.scenario.c_str(),
                r.job.c_str(), r.node, r.workers_after, bytes, static_cast<long long>(r.busiest_bytes), copy_ms, wait_ms, copy_ms - wait_ms,
                gbps.c_str(), all.c_str(), p2p.c_str(), ratio.c_str(), record_ms(r, "connect_ms"), record_ms(r, "prepare_ms"));
  }

  std::cout << "\nwhere the downtime goes (ms): the lost part of the interrupted step, detection, first notice ->\n"
               "the re-run step's start (decision + new epoch: mesh, copies, views), the re-run step (new configuration)\n";
  std::printf("%-28s %-8s %-14s %4s %8s %8s %10s %8s %9s\n", "scenario", "job", "fault", "node", "partial", "detect",
              "reconfig", "re-run", "downtime");
  for (const auto& r : results)
    std::printf("%-28s %-8s %-14s %4d %8.1f %8.1f %10.1f %8.1f %9.1f\n", r.scenario.c_str(), r.job.c_str(), r.kind.c_str(),
                r.node, r.fault_after_commit_ms, r.detect_ms, r.resume_ms - r.resumed_step_ms - r.detect_ms,
                r.resumed_step_ms, record_ms(r, "downtime_ms"));
}

copy_fit fit_copy_time(const std::vector<fault_result>& results) {
  std::vector<std::pair<double, double>> pts;  // (busiest bytes, copy_ms)
  for (const auto& r : results)
    if (!r.record.is_null() && r.plan_matches) pts.emplace_back(static_cast<double>(r.busiest_bytes), r.record["copy_ms"].get<double>());
  // Theil-Sen (robust to a descheduled process): the median of the slopes between events whose
  // sizes differ at least twofold, and the median intercept.
  copy_fit fit;
  fit.points = pts.size();
  {
    std::vector<double> slopes;  // ms per byte
    for (std::size_t a = 0; a < pts.size(); ++a)
      for (std::size_t b = 0; b < pts.size(); ++b)
        if (pts[b].first >= 2 * pts[a].first && pts[a].first > 0)
          slopes.push_back((pts[b].second - pts[a].second) / (pts[b].first - pts[a].first));
    const double slope = median(slopes);
    if (std::isfinite(slope) && slope > 0) {
      fit.bytes_per_ms = 1 / slope;
      std::vector<double> intercepts;
      for (auto [x, y] : pts) intercepts.push_back(y - x * slope);
      fit.fixed_ms = median(intercepts);
    }
  }
  return fit;
}

bool is_crash(const fault_result& r) { return r.kind == "kill -9"; }

fault_summary summarize(const std::vector<fault_result>& results) {
  auto pick = [&](const std::function<bool(const fault_result&)>& f, const std::function<double(const fault_result&)>& g) {
    std::vector<double> v;
    for (const auto& r : results)
      if (f(r)) v.push_back(g(r));
    return v;
  };
  auto is_hang_default = [](const fault_result& r) { return r.kind != "kill -9" && r.heartbeat == default_heartbeat(); };
  auto is_hang_short = [](const fault_result& r) { return r.kind != "kill -9" && r.heartbeat != default_heartbeat(); };
  auto has_record = [](const fault_result& r) { return !r.record.is_null(); };
  fault_summary s;
  s.crash_detect = pick(is_crash, [](const fault_result& r) { return r.detect_ms; });
  s.crash_lost = pick(is_crash, [](const fault_result& r) { return r.loss_notice_ms; });
  s.hang_default = pick(is_hang_default, [](const fault_result& r) { return r.loss_notice_ms; });
  s.hang_short = pick(is_hang_short, [](const fault_result& r) { return r.loss_notice_ms; });
  s.decisions = pick(has_record, [](const fault_result& r) { return r.record["plan_ms"].get<double>(); });
  // Per link: the busiest link's bytes over the slowest node's copy time (the links run at once, so
  // all bytes over that time would credit parallelism, not the transport).
  s.bandwidths = pick(has_copy, busiest_gbps);
  // All links together: on one machine they share the same cores, so this is what its cores moved.
  s.bandwidths_all = pick(has_copy, all_links_gbps);
  auto referenced = [](const fault_result& r) { return has_copy(r) && r.p2p_gb_per_s > 0; };
  auto ratio = [](const fault_result& r) { return busiest_gbps(r) / r.p2p_gb_per_s; };
  auto all_ratio = [](const fault_result& r) { return all_links_gbps(r) / r.p2p_gb_per_s; };
  s.bandwidth_ratios = pick(referenced, ratio);
  s.bandwidth_all_ratios = pick(referenced, all_ratio);
  auto large = [&](const fault_result& r) { return referenced(r) && r.busiest_bytes >= (4 << 20); };
  auto large_shared = [&](const fault_result& r) { return large(r) && !own_cores(r); };
  s.large_bandwidth_ratios = pick(large_shared, ratio);
  s.large_bandwidth_all_ratios = pick(large_shared, all_ratio);
  s.own_core_bandwidth_ratios = pick([&](const fault_result& r) { return large(r) && own_cores(r); }, ratio);
  for (const auto& r : results)
    if (!r.record.is_null()) {
      ++s.bound_total;
      s.bound_met += r.record["downtime_ms"].get<double>() <= downtime_bound_ms(r);
    }
  return s;
}

json print_targets(const fault_summary& s, std::optional<std::pair<double, std::int64_t>> single_p2p) {
  json targets = json::array();
  auto target = [&](const std::string& what, const std::string& goal, double value, bool met) {
    targets.push_back({{"what", what}, {"target", goal}, {"measured", value}, {"met", met}});
    std::printf("  %-58s %-22s %10.2f  %s\n", what.c_str(), goal.c_str(), value, met ? "met" : "NOT MET");
  };
  std::cout << "\ntargets (worst case over the events above; the copy bandwidth: the median of the events whose busiest\n"
               "link moved >= 4 MiB, against the host transport's p2p for as many bytes measured in this run; the events\n"
               "whose workers each had a core of their own apart from those with more workers than this machine's "
            << machine_cores() << " cores)\n";
  target("crash detected (kill -9 -> first failure notice), ms", "<= 100", max_of(s.crash_detect), max_of(s.crash_detect) <= 100);
  if (!s.hang_default.empty())
    target("hang detected, default heartbeat " + default_heartbeat() + " ms, ms", "<= 2000", max_of(s.hang_default), max_of(s.hang_default) <= 2000);
  if (!s.hang_short.empty())
    target("hang detected, other heartbeat settings, ms", "<= 2000", max_of(s.hang_short), max_of(s.hang_short) <= 2000);
  target("reconfiguration decision, ms", "<= 10", max_of(s.decisions), max_of(s.decisions) <= 10);
  target("events with downtime <= detect + step + copy + 500 ms", "all " + std::to_string(s.bound_total), s.bound_met,
         s.bound_met == s.bound_total && s.bound_total > 0);
  if (!s.own_core_bandwidth_ratios.empty()) {
    const double m = median(s.own_core_bandwidth_ratios);
    target("copy bandwidth / p2p, same bytes, a core per worker", ">= 0.5", m, m >= 0.5);
    std::printf("  (busiest link / p2p over those %zu events: %.2f-%.2f)\n", s.own_core_bandwidth_ratios.size(),
                min_of(s.own_core_bandwidth_ratios), max_of(s.own_core_bandwidth_ratios));
  }
  if (!s.large_bandwidth_ratios.empty()) {
    const double m = median(s.large_bandwidth_ratios), all = median(s.large_bandwidth_all_ratios);
    target("copy bandwidth / p2p, same bytes, more workers than cores", ">= 0.5", m, m >= 0.5);
    target("  the same with every link's bytes (links share the cores)", ">= 0.5", all, all >= 0.5);
    std::printf("  (busiest link / p2p over those %zu events: %.2f-%.2f; best of every event %.2f)\n",
                s.large_bandwidth_ratios.size(), min_of(s.large_bandwidth_ratios), max_of(s.large_bandwidth_ratios),
                max_of(s.bandwidth_ratios));
  }
  if (single_p2p && single_p2p->first > 0)
    std::printf("  (against one figure for every event, %.2f GB/s at %lld bytes, the size nearest the mean copy's, as this\n"
                "   benchmark compared before: busiest link %.2f, every link %.2f)\n",
                single_p2p->first, static_cast<long long>(single_p2p->second), max_of(s.bandwidths) / single_p2p->first,
                max_of(s.bandwidths_all) / single_p2p->first);
  return targets;
}

}  // namespace oobleck::bench
