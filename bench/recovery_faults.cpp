#include "bench/recovery_faults.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

#include "bench/bench_text.hpp"
#include "bench/recovery_cluster.hpp"
#include "bench/recovery_plan.hpp"

namespace oobleck::bench {

std::vector<fault_result> run_scenario(const std::string& bin, const scenario& s, int& spurious_losses) {
  std::cout << "  " << s.name << " (" << s.job_name << ", " << s.nodes << " nodes, heartbeat " << s.heartbeat_ms
            << " ms / timeout " << s.timeout_ms << " ms; load " << load_average() << ") ..." << std::flush;
  const auto started = clock_type::now();
  local_cluster c({bin, s.job_text, s.nodes, s.steps, s.heartbeat_ms, s.timeout_ms});
  std::vector<fault_result> results;
  // Every time below is a unix_ms: the coordinator's events carry the system clock of when it
  // published them, and the fault's time is the same clock read just before the signal.
  std::map<std::uint64_t, double> commits;  // the first commit event of each step
  auto committed = [](const timed_event& e) { return e.event.kind == event_kind::step_committed; };
  auto note_commits = [&](std::size_t upto) {
    for (std::size_t i = 0; i < upto; ++i)
      if (const auto& e = c.events()[i]; committed(e) && !commits.count(e.event.step)) commits[e.event.step] = e.unix_ms;
  };
  std::size_t cursor = 0;
  auto fail = [&](const std::string& what) {
    c.keep_files();
    throw std::runtime_error(s.name + ": " + what + " (files in " + c.dir().string() + ")\n" + c.transcript());
  };
  const double patience = s.timeout_ms / 1000.0 + 60;
  for (const auto& f : s.faults) {
    const auto step_before = static_cast<std::uint64_t>(f.step - 1);
    const auto at = c.wait_for([&](const timed_event& e) { return committed(e) && e.event.step == step_before; }, cursor, 120);
    if (!at) fail("step " + std::to_string(f.step - 1) + " never committed");
    note_commits(*at + 1);
    std::vector<double> intervals;
    for (std::uint64_t k = 2; k < static_cast<std::uint64_t>(f.step); ++k)
      if (commits.count(k) && commits.count(k - 1)) intervals.push_back(commits[k] - commits[k - 1]);
    fault_result r;
    r.scenario = s.name;
    r.job = s.job_name;
    r.kind = f.sig == SIGKILL ? "kill -9" : "hang (SIGSTOP)";
    r.heartbeat = std::to_string(s.heartbeat_ms) + "/" + std::to_string(s.timeout_ms);
    r.node = f.node;
    r.step = f.step;
    r.workers_after = s.nodes - static_cast<int>(results.size()) - 1;
    r.step_ms = median(intervals);
    const double last_commit = c.events()[*at].unix_ms;
    sleep_until_unix_ms(last_commit + r.step_ms / 2);
    c.events().read();
    const std::size_t before = c.events().size();
    const double t_fault = c.signal(f.node, f.sig);
    r.fault_after_commit_ms = t_fault - last_commit;
    const auto notice = c.wait_for(is_failure_notice, before, patience);
    if (!notice) fail("no failure notice after the fault");
    r.detect_ms = c.events()[*notice].unix_ms - t_fault;
    const auto lost_at = c.wait_for(
        [&](const timed_event& e) { return e.event.kind == event_kind::node_lost && e.event.node == f.node; }, before,
        patience);
    if (!lost_at) fail("node " + std::to_string(f.node) + " was never declared lost");
    r.loss_notice_ms = c.events()[*lost_at].unix_ms - t_fault;
    const auto resumed = c.wait_for(committed, before, 120);
    if (!resumed) fail("no step committed after the fault");
    r.resume_ms = c.events()[*resumed].unix_ms - t_fault;
    r.bench_downtime_ms = c.events()[*resumed].unix_ms - last_commit;
    cursor = *resumed + 1;
    if (f.sig == SIGSTOP) c.kill(f.node);  // it was replaced: end it (it would be fenced and exit on waking)
    results.push_back(std::move(r));
  }
  const auto finished = c.wait_for(
      [](const timed_event& e) {
        return e.event.kind == event_kind::stopped && e.event.outcome == messages::stop_outcome::finished;
      },
      cursor, 300);
  if (!finished) fail("the job did not finish");
  const int status = c.wait_exit(60);
  if (status != 0) fail("the coordinator exited with status " + std::to_string(status));

  std::vector<nlohmann::json> steps, events;
  c.read_metrics(steps, events);
  // Losses nobody caused (a heartbeat timeout on a healthy, descheduled node).
  c.events().read();
  for (const auto& e : c.events().events()) {
    if (e.event.kind != event_kind::node_lost) continue;
    const auto id = e.event.node;
    if (std::none_of(s.faults.begin(), s.faults.end(), [&](const fault_plan& f) { return f.node == id; })) {
      ++spurious_losses;
      std::cout << " [spurious loss of node " << id << "]";
    }
  }
  // Match records to faults, and recompute the planner's copy plans.
  const job_model model(s.job_text, s.nodes);
  plan_replay replay(model);
  std::size_t next = 0;
  for (const auto& e : events) {
    std::vector<planning::node_id> lost;
    for (const auto& n : e["lost"]) lost.push_back(planning::node_id{n.get<std::int64_t>()});
    const auto r = lost.empty() ? planning::reconfiguration{} : replay.lose(lost);
    for (std::size_t i = next; i < results.size(); ++i) {
      if (std::find(lost.begin(), lost.end(), planning::node_id{results[i].node}) == lost.end()) continue;
      auto& res = results[i];
      res.record = json::parse(e.dump());
      std::int64_t total = 0;
      for (const auto& cp : r.copies) total += cp.bytes;
      res.predicted_bytes = total;
      res.copies = static_cast<int>(r.copies.size());
      res.busiest_bytes = busiest_link_bytes(r.copies);
      res.plan_matches = total == e["copy_bytes"].get<std::int64_t>();
      if (lost.size() > 1) res.notes.push_back("one recovery for several losses");
      for (const auto& st : steps)
        if (st["step"] == e["resumed_step"]) res.resumed_step_ms = st["wall_ms"].get<double>();
      next = i + 1;
      break;
    }
  }
  for (auto& r : results)
    if (r.record.is_null()) r.notes.push_back("no reconfigured record");
  std::cout << " " << fmt("%.1f", ms_between(started, clock_type::now()) / 1000) << " s\n";
  return results;
}

double record_ms(const fault_result& r, const char* key) {
  return r.record.is_null() || !r.record.contains(key) ? std::nan("") : r.record[key].get<double>();
}

bool has_copy(const fault_result& r) { return !r.record.is_null() && r.busiest_bytes > 0 && record_ms(r, "copy_ms") > 0; }

double busiest_gbps(const fault_result& r) { return static_cast<double>(r.busiest_bytes) / record_ms(r, "copy_ms") / 1e6; }

double all_links_gbps(const fault_result& r) { return record_ms(r, "copy_bytes") / record_ms(r, "copy_ms") / 1e6; }

double downtime_bound_ms(const fault_result& r) { return r.detect_ms + r.step_ms + record_ms(r, "copy_ms") + 500; }

int machine_cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

bool own_cores(const fault_result& r) { return r.workers_after <= machine_cores(); }

json result_json(const fault_result& r) {
  json j;
  j["scenario"] = r.scenario;
  j["job"] = r.job;
  j["fault"] = r.kind;
  j["heartbeat_ms"] = r.heartbeat;
  j["node"] = r.node;
  j["step"] = r.step;
  j["workers_after_fault"] = r.workers_after;
  j["machine_cores"] = machine_cores();
  j["failure_free_step_ms"] = r.step_ms;
  j["fault_after_commit_ms"] = r.fault_after_commit_ms;
  j["detect_ms"] = r.detect_ms;
  j["loss_notice_ms"] = r.loss_notice_ms;
  j["resume_ms"] = r.resume_ms;
  j["bench_downtime_ms"] = r.bench_downtime_ms;
  j["resumed_step_ms"] = r.resumed_step_ms;
  j["record"] = r.record;
  j["copies"] = r.copies;
  j["busiest_link_bytes"] = r.busiest_bytes;
  j["copy_plan_matches_record"] = r.plan_matches;
  if (!r.record.is_null()) {
    const double copy_ms = r.record["copy_ms"].get<double>();
    j["copy_gb_per_s"] = copy_ms > 0 ? all_links_gbps(r) : 0;  // all links together
    j["busiest_link_gb_per_s"] = copy_ms > 0 ? busiest_gbps(r) : 0;
    j["downtime_steps"] = r.record["downtime_ms"].get<double>() / r.step_ms;
    j["downtime_bound_ms"] = downtime_bound_ms(r);
    if (r.p2p_gb_per_s > 0 && copy_ms > 0) {
      j["p2p_gb_per_s_for_busiest_bytes"] = r.p2p_gb_per_s;
      j["copy_vs_p2p"] = busiest_gbps(r) / r.p2p_gb_per_s;
    }
  }
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j;
}

}  // namespace oobleck::bench
