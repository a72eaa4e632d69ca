#include "bench/recovery_coordinator.hpp"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>

#include "apps/job_file.hpp"
#include "bench/bench_text.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_events.hpp"
#include "bench/recovery_report.hpp"
#include "messages/profile_file.hpp"

namespace fs = std::filesystem;

namespace oobleck::bench {

namespace {

constexpr double loss_rtol = 1e-4;  // DESIGN.md, "nothing lost": the failure-free loss curve within 1e-4

/// One oobleck-local run in a scratch folder of its own: its exit, metrics and events.
struct local_run {
  fs::path dir;
  program_run program;
  metrics_records metrics;
  std::vector<timed_event> events;
};

local_run run_local(const coordinator_runs& o, const coordinator_fault* fault) {
  char tmpl[] = "/tmp/oobleck-bench-coordinator-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a scratch directory");
  local_run r;
  r.dir = tmpl;
  std::ofstream(r.dir / "job.toml") << o.job_text;
  // Every run plans from the job's modelled profile: profiled at its start, a run's plan depends on
  // the speed this machine ran at in that moment, and a faulted run whose plan differs from the
  // failure-free run's (2 pipelines of 3 against 3 of 2: another reduction order) cannot match its
  // layer digests bitwise, whatever the recovery did (seen in CI: "the last step's layer digests
  // differ" with every loss equal).
  messages::write_profile_json(apps::modelled_profile(apps::parse_job(o.job_text, "job")),
                               (r.dir / "profile.json").string());
  std::vector<std::string> args{"--config",      (r.dir / "job.toml").string(),     "--steps",
                                std::to_string(o.steps), "--metrics-out", (r.dir / "metrics.jsonl").string(),
                                "--events-out",  (r.dir / "events.jsonl").string(), "--timeout", "120",
                                "--profile",     (r.dir / "profile.json").string()};
  if (fault) args.insert(args.end(), {fault->flag, fault->value});
  r.program = run_program(o.bin + "/oobleck-local", args, 150);
  if (fs::exists(r.dir / "metrics.jsonl")) r.metrics = read_metrics(r.dir / "metrics.jsonl");
  r.events = read_events(r.dir / "events.jsonl");
  return r;
}

/// Step -> its step record (the first one of each step).
std::map<std::int64_t, nlohmann::json> step_records(const metrics_records& m) {
  std::map<std::int64_t, nlohmann::json> by_step;
  for (const auto& s : m.steps) by_step.emplace(s["step"].get<std::int64_t>(), s);
  return by_step;
}

/// Whether a run's trajectory is the failure-free run's: each recorded step's loss within 1e-4
/// (relative), the last step recorded and its layer digests equal. Notes what differs.
bool same_trajectory(const metrics_records& run, const std::map<std::int64_t, nlohmann::json>& reference,
                     std::int64_t steps, std::vector<std::string>& notes) {
  const auto mine = step_records(run);
  bool same = true;
  std::vector<std::int64_t> missing;
  for (std::int64_t k = 0; k < steps; ++k)
    if (!mine.count(k)) missing.push_back(k);
  if (run.steps.size() != mine.size()) notes.push_back("a step recorded twice");
  for (const auto& [k, s] : mine) {
    if (!reference.count(k)) {
      notes.push_back("step " + std::to_string(k) + " is not in the failure-free run");
      same = false;
      continue;
    }
    const double want = reference.at(k)["loss"].get<double>(), got = s["loss"].get<double>();
    if (std::abs(got - want) > loss_rtol * std::abs(want)) {
      notes.push_back("step " + std::to_string(k) + ": loss " + fmt("%.6f", got) + " against " + fmt("%.6f", want));
      same = false;
    }
  }
  const std::int64_t last = steps - 1;
  if (!mine.count(last) || !reference.count(last)) {
    notes.push_back("no record of the last step");
    same = false;
  } else if (mine.at(last)["layer_digests"] != reference.at(last)["layer_digests"]) {
    notes.push_back("the last step's layer digests differ from the failure-free run's");
    same = false;
  }
  for (auto k : missing)
    if (k != last) notes.push_back("no step record of step " + std::to_string(k));
  return same;
}

bool is_kind(const timed_event& e, event_kind k) { return e.event.kind == k; }

/// Where the downtime went, from the events: the fault is the first event after training began
/// that is neither a commit nor a commit standing (a node registering again, a loss, an epoch
/// formed again, a failed step).
void time_events(const std::vector<timed_event>& ev, coordinator_result& r) {
  auto committed = [](const timed_event& e) { return is_kind(e, event_kind::step_committed); };
  const auto first = std::find_if(ev.begin(), ev.end(), committed);
  if (first == ev.end()) return r.notes.push_back("no step committed");
  const auto fault = std::find_if(first, ev.end(), [&](const timed_event& e) {
    return !committed(e) && !is_kind(e, event_kind::commit_stood);
  });
  if (fault == ev.end()) return r.notes.push_back("no event of the fault");
  const auto before = std::find_if(std::make_reverse_iterator(fault), ev.rend(), committed);
  const auto after = std::find_if(fault, ev.end(), committed);
  if (after == ev.end()) return r.notes.push_back("no step committed after the fault");
  const double last = before->unix_ms;
  r.bench_downtime_ms = after->unix_ms - last;
  // The failure-free step: the commit interval before the fault (from step 2: step 0 and 1 warm up).
  std::map<std::uint64_t, double> commits;
  for (auto it = first; it != fault; ++it)
    if (committed(*it)) commits.emplace(it->event.step, it->unix_ms);
  std::vector<double> intervals;
  for (const auto& [k, t] : commits)
    if (k >= 2 && commits.count(k - 1)) intervals.push_back(t - commits[k - 1]);
  r.step_ms = median(intervals);
  // The phases lead to the epoch that formed: its epoch_forming, and the last node back before
  // it (a coordinator that wakes from a freeze first forms an epoch over nodes it has lost; that
  // attempt, which never forms, falls in back or gather).
  std::optional<double> back, last_back, forming, formed;
  for (auto it = fault; it != after; ++it) {
    if (is_kind(*it, event_kind::node_joined)) {
      ++r.nodes_back;
      if (!back) back = it->unix_ms;
    }
    if (is_kind(*it, event_kind::node_lost)) ++r.lost;
    if (is_kind(*it, event_kind::epoch_formed)) formed = it->unix_ms;
  }
  std::vector<double> joins;
  for (auto it = fault; it != after && formed && it->unix_ms <= *formed; ++it) {
    if (is_kind(*it, event_kind::epoch_forming)) forming = it->unix_ms;
    if (is_kind(*it, event_kind::node_joined)) joins.push_back(it->unix_ms);
  }
  for (double t : joins)
    if (forming && t <= *forming) last_back = t;
  if (back) r.back_ms = *back - last;
  if (back && last_back) r.gather_ms = *last_back - *back;
  if (last_back && forming) r.decide_ms = *forming - *last_back;
  if (forming && formed) r.form_ms = *formed - *forming;
  if (formed) r.rerun_ms = after->unix_ms - *formed;
}

/// The kinds in the order they first appear.
std::vector<std::string> kinds_of(const std::vector<coordinator_result>& results) {
  std::vector<std::string> kinds;
  for (const auto& r : results)
    if (std::find(kinds.begin(), kinds.end(), r.kind) == kinds.end()) kinds.push_back(r.kind);
  return kinds;
}

std::vector<double> pick(const std::vector<coordinator_result>& results, const std::string& kind,
                         double coordinator_result::*figure) {
  std::vector<double> v;
  for (const auto& r : results)
    if (r.kind == kind && r.ok() && std::isfinite(r.*figure)) v.push_back(r.*figure);
  return v;
}

/// The worker losses of the default job (the job the coordinator runs use), by kind: the
/// reconfigured records' downtime and the same on the events' clock.
struct worker_downtime {
  std::vector<double> record, events;
};
std::map<std::string, worker_downtime> worker_downtimes(const std::vector<fault_result>& workers) {
  std::map<std::string, worker_downtime> by;
  for (const auto& w : workers)
    if (w.job == "default" && !w.record.is_null()) {
      auto& d = by["worker " + w.kind + (is_crash(w) ? "" : ", heartbeat " + w.heartbeat + " ms")];
      d.record.push_back(w.record["downtime_ms"].get<double>());
      d.events.push_back(w.bench_downtime_ms);
    }
  return by;
}

}  // namespace

coordinator_fault coordinator_fault_of(const std::string& kind, int step, double hang_s) {
  const std::string k = std::to_string(step);
  if (kind == "kill") return {"coordinator kill -9", "--kill-coordinator-at", k, step};
  if (kind == "commit") return {"coordinator kill at commit", "--kill-coordinator-at", k + ":commit", step};
  if (kind == "hang")
    return {"coordinator hang " + fmt("%g", hang_s) + " s", "--hang-coordinator-at", k + ":" + fmt("%g", hang_s), step};
  throw std::invalid_argument("unknown coordinator fault '" + kind + "' (kill, commit or hang)");
}

std::vector<coordinator_result> run_coordinator_losses(const coordinator_runs& o) {
  std::cout << "  coordinator losses (oobleck-local, " << o.steps << " steps, " << o.repeats
            << " run(s) of each kind; load " << load_average() << ")\n";
  const auto started = clock_type::now();
  auto reference_run = run_local(o, nullptr);
  if (reference_run.program.status != 0)
    throw std::runtime_error("the failure-free run exited with status " + std::to_string(reference_run.program.status) +
                             ":\n" + reference_run.program.transcript());
  const auto reference = step_records(reference_run.metrics);
  fs::remove_all(reference_run.dir);
  std::vector<coordinator_result> results;
  for (int run = 0; run < o.repeats; ++run)
    for (const auto& f : o.faults) {
      auto l = run_local(o, &f);
      coordinator_result r;
      r.kind = f.name;
      r.run = run;
      r.step = f.step;
      r.status = l.program.status;
      for (const auto& e : l.metrics.events) {
        if (e["event"] == "coordinator_restored" && r.restored.is_null()) r.restored = json::parse(e.dump());
        if (e["event"] == "reconfigured" && r.reconfigured.is_null()) r.reconfigured = json::parse(e.dump());
      }
      if (!r.restored.is_null()) r.downtime_ms = r.restored["downtime_ms"].get<double>();
      time_events(l.events, r);
      // The record's figure and the events' should agree (they do to 0.1 ms for a worker's loss).
      if (const double off = r.downtime_ms - r.bench_downtime_ms; std::abs(off) > std::max(50.0, 0.05 * r.bench_downtime_ms))
        r.notes.push_back("the record's downtime is " + fmt("%+.0f", off) + " ms off the events' (" +
                          fmt("%.0f", r.bench_downtime_ms) + " ms)");
      r.same_trajectory = same_trajectory(l.metrics, reference, o.steps, r.notes);
      if (r.status != 0) r.notes.push_back("oobleck-local exited with status " + std::to_string(r.status));
      if (r.restored.is_null()) r.notes.push_back("no coordinator_restored record");
      std::cout << "    " << f.name << ", run " << run + 1 << ": ";
      if (r.ok()) {
        std::cout << "downtime " << fmt("%.1f", r.downtime_ms) << " ms";
        fs::remove_all(l.dir);
      } else {
        std::ofstream(l.dir / "oobleck-local.log") << l.program.transcript();
        r.notes.push_back("files in " + l.dir.string());
        std::cout << "FAILED (" << r.notes.front() << "; files in " << l.dir.string() << ")";
      }
      std::cout << " (load " << load_average() << ")\n";
      results.push_back(std::move(r));
    }
  std::cout << "  coordinator losses: " << fmt("%.1f", ms_between(started, clock_type::now()) / 1000) << " s\n";
  return results;
}

void print_coordinator_tables(const std::vector<coordinator_result>& results, const std::vector<fault_result>& workers) {
  std::cout << "\ncoordinator losses, per run (ms; oobleck-local, the default job; downtime: the coordinator_restored\n"
               "record's, from the nodes' last commit before the loss to the first commit after; on the events' clock:\n"
               "back = last commit -> the first node registered again (the fault, the replacement's start, the workers'\n"
               "reconnect period); gather = first -> last node back; decide = last node back -> the epoch_forming of the epoch\n"
               "that formed (a decided commit completed on the nodes that missed it); form = that epoch_forming -> its\n"
               "epoch_formed; re-run = epoch_formed -> the first commit; events = the same downtime on the events' clock;\n"
               "step = failure-free commit interval;\n"
               "done = nodes that applied the decided commit from their kept gradients; same = the failure-free trajectory)\n";
  std::printf("%-28s %3s %4s %6s %7s %7s %7s %7s %7s %7s %9s %8s %4s %5s %4s\n", "fault", "run", "step", "status", "step",
              "back", "gather", "decide", "form", "re-run", "downtime", "events", "back", "done", "same");
  for (const auto& r : results) {
    const int done = r.restored.is_null() ? -1 : r.restored["completed"].get<int>();
    std::printf("%-28s %3d %4d %6d %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %9.1f %8.1f %4d %5d %4s\n", r.kind.c_str(),
                r.run + 1, r.step, r.status, r.step_ms, r.back_ms, r.gather_ms, r.decide_ms, r.form_ms, r.rerun_ms,
                r.downtime_ms, r.bench_downtime_ms, r.nodes_back, done, r.ok() ? "yes" : "NO");
  }
  for (const auto& r : results)
    if (!r.notes.empty()) {
      std::cout << "  " << r.kind << ", run " << r.run + 1 << ":";
      for (const auto& n : r.notes) std::cout << " " << n << ";";
      std::cout << "\n";
    }

  std::cout << "\ndowntime beside a worker loss's (ms, last commit before -> first commit after, the coordinator's own\n"
               "figure: the reconfigured record's for a worker, coordinator_restored's for the coordinator; the default\n"
               "job; events: the median on the events' clock; where a coordinator loss's downtime goes: medians of the\n"
               "columns above)\n";
  std::printf("%-44s %3s %9s %9s %9s %9s   %7s %7s %7s %7s %7s\n", "fault", "n", "median", "min", "max", "events",
              "back", "gather", "decide", "form", "re-run");
  for (const auto& [name, d] : worker_downtimes(workers))
    std::printf("%-44s %3zu %9.1f %9.1f %9.1f %9.1f\n", name.c_str(), d.record.size(), median(d.record),
                min_of(d.record), max_of(d.record), median(d.events));
  for (const auto& kind : kinds_of(results)) {
    const auto v = pick(results, kind, &coordinator_result::downtime_ms);
    int failed = 0;
    for (const auto& r : results) failed += r.kind == kind && !r.ok();
    const std::string name = kind + (failed ? " (" + std::to_string(failed) + " failed)" : "");
    std::printf("%-44s %3zu %9.1f %9.1f %9.1f %9.1f   %7.1f %7.1f %7.1f %7.1f %7.1f\n", name.c_str(), v.size(),
                median(v), min_of(v), max_of(v), median(pick(results, kind, &coordinator_result::bench_downtime_ms)),
                median(pick(results, kind, &coordinator_result::back_ms)),
                median(pick(results, kind, &coordinator_result::gather_ms)),
                median(pick(results, kind, &coordinator_result::decide_ms)),
                median(pick(results, kind, &coordinator_result::form_ms)),
                median(pick(results, kind, &coordinator_result::rerun_ms)));
  }
}

json coordinator_json(const coordinator_runs& o, const std::vector<coordinator_result>& results,
                      const std::vector<fault_result>& workers) {
  json j;
  j["method"] =
      "oobleck-local runs the job for `steps` steps with one coordinator fault each run (--kill-coordinator-at STEP: "
      "SIGKILL in the middle of the step; STEP:commit: right after it decided the step's commit and told one node; "
      "--hang-coordinator-at STEP:SECONDS: SIGSTOP that long); oobleck-local starts a replacement at the same address "
      "when the coordinator died; downtime_ms is the coordinator_restored record's (the nodes' last commit before the "
      "loss -> the first commit after); the breakdown is on the job events' clock; every run's losses and last layer "
      "digests are checked against a failure-free run of the same job";
  j["steps"] = o.steps;
  j["runs_per_kind"] = o.repeats;
  j["events"] = json::array();
  for (const auto& r : results) {
    json e;
    e["fault"] = r.kind;
    e["run"] = r.run + 1;
    e["step"] = r.step;
    e["status"] = r.status;
    e["ok"] = r.ok();
    e["failure_free_step_ms"] = r.step_ms;
    e["downtime_ms"] = r.downtime_ms;
    e["events_downtime_ms"] = r.bench_downtime_ms;
    e["back_ms"] = r.back_ms;
    e["gather_ms"] = r.gather_ms;
    e["decide_ms"] = r.decide_ms;
    e["form_ms"] = r.form_ms;
    e["rerun_ms"] = r.rerun_ms;
    e["nodes_back"] = r.nodes_back;
    e["nodes_lost"] = r.lost;
    e["same_trajectory"] = r.same_trajectory;
    e["coordinator_restored"] = r.restored;
    e["reconfigured"] = r.reconfigured;
    if (!r.notes.empty()) e["notes"] = r.notes;
    j["events"].push_back(e);
  }
  json summary;
  for (const auto& kind : kinds_of(results)) {
    json k;
    int failed = 0;
    for (const auto& r : results) failed += r.kind == kind && !r.ok();
    k["failed_runs"] = failed;
    k["downtime_ms"] = stats(pick(results, kind, &coordinator_result::downtime_ms));
    k["events_downtime_ms"] = stats(pick(results, kind, &coordinator_result::bench_downtime_ms));
    k["back_ms"] = stats(pick(results, kind, &coordinator_result::back_ms));
    k["gather_ms"] = stats(pick(results, kind, &coordinator_result::gather_ms));
    k["decide_ms"] = stats(pick(results, kind, &coordinator_result::decide_ms));
    k["form_ms"] = stats(pick(results, kind, &coordinator_result::form_ms));
    k["rerun_ms"] = stats(pick(results, kind, &coordinator_result::rerun_ms));
    k["failure_free_step_ms"] = stats(pick(results, kind, &coordinator_result::step_ms));
    summary[kind] = k;
  }
  for (const auto& [name, d] : worker_downtimes(workers)) {
    summary[name]["downtime_ms"] = stats(d.record);
    summary[name]["events_downtime_ms"] = stats(d.events);
  }
  j["summary"] = summary;
  return j;
}

}  // namespace oobleck::bench
