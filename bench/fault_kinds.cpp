// Fault kinds (issue 23, "Done when"): for each kind of fault oobleck-local can inject, how fast
// the coordinator knew, how many step attempts were lost, the downtime, and whether the job's
// trajectory equals the failure-free run of the same job.
//
// Every run is the default job (6 nodes) with short deadlines (the [faults] and [cluster] keys
// below: a stall is named in seconds, a hang found by a 5 s heartbeat timeout, healthy loaded
// workers never lost), `--steps` steps with the fault at step K on node N. Every figure comes from
// the job's events (--events-out) and metrics (--metrics-out), all unix_ms of this machine's clock:
//
//   detection ms   from the commit of step K-1 (the start of the faulty step) to the first event
//                  that names the node: its node_lost (kill, hang) or its step_failed (a stage
//                  error, a stall named by the step deadline)
//   node lost ms   from the same commit to the node's node_lost: its eviction (detail "evicted: ...")
//                  for the kinds that evict, the heartbeat timeout for a hang (whose step deadline
//                  names it first)
//   attempts lost  step attempts that ran and did not commit: every epoch that had formed (so ran
//                  its step) and was replaced by a new epoch_forming whose first step had not
//                  committed (a commit that stood is committed; a join's formation at a step
//                  boundary is not counted)
//   forms failed   epochs replaced before they had formed (ran nothing)
//   downtime ms    from the commit of step K-1 to the first commit of a step >= K (step_committed
//                  or commit_stood)
//   trajectory =   every step 0..S-1 committed exactly once (metrics records) and each loss within
//                  1e-4 relative of the failure-free run of the same job file
//   outcome        the `stopped` event's outcome and what happened to the node
//
// SIGTERM with a checkpoint folder: oobleck-local --checkpoint-dir D gets SIGTERM once step K-1
// has committed; it writes a checkpoint of the last committed step and stops (outcome shutdown).
// Its "detection" is from the SIGTERM to the checkpoint_written event (the checkpoint write);
// it is then resumed (--resume D) and the union of both runs' steps must equal the failure-free
// trajectory; downtime runs from the stopped run's last commit to the resumed run's first (process
// start, registration, loading the checkpoint included); attempts lost are the steps the stopped
// run committed after its checkpoint (the resumed run does them again).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_flags.hpp"
#include "bench/bench_text.hpp"
#include "bench/cluster_programs.hpp"
#include "bench/job_events.hpp"
#include "bench/job_toml.hpp"
#include "runtime/child_process.hpp"

namespace fs = std::filesystem;
using namespace oobleck;
using bench::event_kind;
using bench::timed_event;

namespace {

const std::string apps_dir = OOBLECK_APPS_DIR;
constexpr double loss_rtol = 1e-4;

struct options {
  bool quick = false;
  std::string json_path = "bench/results/fault_kinds.json";
  int repeats = 3;
  int steps = 12;
  int fault_step = 5;
  int node = 2;
  std::string kinds;  ///< comma-separated subset; empty: all (quick: its subset)
  bool keep = false;
};

/// One kind of fault: the flags that inject it (none for SIGTERM, which the benchmark sends).
struct kind {
  std::string name, label;
  std::vector<std::string> flags;
  bool evicts = false;
  bool sigterm = false;
};

std::vector<kind> all_kinds(const options& o) {
  const std::string at = std::to_string(o.fault_step) + ":" + std::to_string(o.node);
  return {
      {"kill", "kill -9 (--fail-at)", {"--fail-at", at}},
      {"hang", "hang, SIGSTOP (--hang-at)", {"--hang-at", at}},
      {"error_once", "stage error once (--error-at K:N/1)", {"--error-at", at + "/1"}},
      {"error_always", "stage error every attempt (--error-at)", {"--error-at", at}, true},
      {"stall", "stall in compute (--stall-at)", {"--stall-at", at}, true},
      {"sigterm", "SIGTERM with --checkpoint-dir, resumed", {}, false, true},
  };
}

std::optional<options> parse(int argc, char** argv, int& exit) {
  options o;
  oobleck::bench::flag_set app{
      "fault_kinds: for each fault kind oobleck-local injects (kill, hang, stage error once / every attempt,\n"
      "stall, SIGTERM with a checkpoint), the detection time, step attempts lost, downtime and whether\n"
      "the trajectory equals the failure-free run (the default job, 6 nodes).",
      "fault_kinds"};
  app.add_switch("--quick", o.quick, "1 repeat of kill, stage error once, stall and SIGTERM (a smoke run)");
  app.add_text("--json", o.json_path, "write the results to PATH (default bench/results/fault_kinds.json)");
  app.add_integer("--repeats", o.repeats, 1, 100, "runs of each kind (default 3)");
  app.add_integer("--steps", o.steps, 3, 10000, "steps per run (default 12)");
  app.add_integer("--fault-step", o.fault_step, 1, 10000, "the step K the fault hits (default 5)");
  app.add_integer("--node", o.node, 0, 5, "the node the fault hits (default 2)");
  app.add_text("--kinds", o.kinds,
               "kinds to run, separated by commas: kill, hang, error_once, error_always, stall, sigterm (default all)")
      .type_name("LIST");
  app.add_switch("--keep", o.keep, "keep every run's files (job, events, metrics, output) and print their folder");
  if (const auto e = app.parse(argc, argv)) {
    exit = *e;
    return std::nullopt;
  }
  if (o.fault_step >= o.steps - 1) {
    std::cerr << "error: --fault-step must be smaller than --steps - 1 (see --help)\n";
    exit = 2;
    return std::nullopt;
  }
  if (o.quick) {
    o.repeats = 1;
    if (o.kinds.empty()) o.kinds = "kill,error_once,stall,sigterm";
  }
  if (!o.kinds.empty()) {
    const auto known = all_kinds(o);
    std::stringstream in(o.kinds);
    for (std::string part; std::getline(in, part, ',');)
      if (std::none_of(known.begin(), known.end(), [&](const kind& k) { return k.name == part; })) {
        std::cerr << "error: --kinds: unknown kind \"" << part << "\" (see --help)\n";
        exit = 2;
        return std::nullopt;
      }
  }
  return o;
}

/// The job: the default job with deadlines short enough that a stall is named in seconds and a
/// hang found in 5 s, and a heartbeat that never loses a healthy worker on a loaded machine.
std::string job_text() {
  return bench::with_keys(bench::default_job_text(apps_dir),
                          {{"faults", "step_deadline_min_ms", std::int64_t{1500}},
                           {"faults", "first_step_deadline_ms", std::int64_t{6000}},
                           {"faults", "form_deadline_ms", std::int64_t{4000}},
                           {"cluster", "heartbeat_interval_ms", std::int64_t{500}},
                           {"cluster", "connection_timeout_ms", std::int64_t{5000}}});
}

/// step -> loss of a metrics file's step records, and the steps that appear more than once.
struct trajectory {
  std::map<std::uint64_t, double> loss;
  std::vector<std::uint64_t> repeated;
};
trajectory read_trajectory(const fs::path& metrics) {
  trajectory t;
  for (const auto& r : bench::read_metrics(metrics).steps) {
    const auto s = r.at("step").get<std::uint64_t>();
    if (!t.loss.emplace(s, r.at("loss").get<double>()).second) t.repeated.push_back(s);
  }
  return t;
}

/// Whether `t` has every step 0..steps-1 once and each loss within loss_rtol of `ref`; why not.
std::string trajectory_difference(const trajectory& t, const trajectory& ref, int steps) {
  if (!t.repeated.empty()) return "step " + std::to_string(t.repeated.front()) + " committed twice";
  for (std::uint64_t s = 0; s < static_cast<std::uint64_t>(steps); ++s) {
    if (!t.loss.count(s)) return "step " + std::to_string(s) + " never committed";
    const double a = t.loss.at(s), b = ref.loss.at(s);
    if (!(std::abs(a - b) <= loss_rtol * std::abs(b)))
      return "step " + std::to_string(s) + ": loss " + bench::fmt("%.6f", a) + " vs " + bench::fmt("%.6f", b);
  }
  if (t.loss.size() != static_cast<std::size_t>(steps)) return "steps beyond " + std::to_string(steps - 1);
  return "";
}

struct run_result {
  std::string kind;
  int repeat = 0;
  int exit_status = -1;
  double detect_ms = NAN, lost_ms = NAN, downtime_ms = NAN;
  bool evicted = false;
  int attempts_lost = 0, formations_failed = 0, step_failed = 0;
  std::string outcome;
  bool trajectory_equal = false;
  std::string trajectory_note;
  std::string checkpoint;  ///< sigterm: the checkpoint's folder
};

std::string outcome_of(const std::vector<timed_event>& events) {
  for (const auto& e : events)
    if (e.event.kind == event_kind::stopped) return messages::event_json(e)["outcome"].get<std::string>();
  return "no stopped event";
}

/// The figures of a run with an injected fault, from its events (see the top of this file).
void analyse(const std::vector<timed_event>& events, const options& o, run_result& r) {
  const auto k = static_cast<std::uint64_t>(o.fault_step);
  std::optional<double> t0;
  std::map<std::uint64_t, double> committed;  // step -> first commit (or stood commit)
  bool formed = false, first_forming = true;
  for (const auto& e : events) {
    const auto& ev = e.event;
    switch (ev.kind) {
      case event_kind::step_committed:
      case event_kind::commit_stood:
        committed.emplace(ev.step, e.unix_ms);
        if (ev.step == k - 1 && !t0) t0 = e.unix_ms;
        if (t0 && ev.step >= k && std::isnan(r.downtime_ms)) r.downtime_ms = e.unix_ms - *t0;
        break;
      case event_kind::node_lost:
      case event_kind::step_failed:
        if (ev.kind == event_kind::step_failed) ++r.step_failed;
        if (t0 && ev.node == o.node) {
          if (std::isnan(r.detect_ms)) r.detect_ms = e.unix_ms - *t0;
          if (ev.kind == event_kind::node_lost && std::isnan(r.lost_ms)) {
            r.lost_ms = e.unix_ms - *t0;
            r.evicted = ev.detail.rfind("evicted", 0) == 0;
          }
        }
        break;
      case event_kind::epoch_forming:
        if (!first_forming && !(ev.lost.empty() && !ev.joined.empty())) {
          if (formed && !committed.count(ev.step)) ++r.attempts_lost;
          if (!formed) ++r.formations_failed;
        }
        first_forming = false;
        formed = false;
        break;
      case event_kind::epoch_formed: formed = true; break;
      default: break;
    }
  }
  r.outcome = outcome_of(events);
  if (r.evicted)
    r.outcome += ", node " + std::to_string(o.node) + " evicted";
  else if (!std::isnan(r.lost_ms))
    r.outcome += ", node " + std::to_string(o.node) + " lost";
}

run_result run_injected(const options& o, const kind& k, int repeat, const fs::path& dir, const fs::path& job,
                        const trajectory& ref) {
  run_result r;
  r.kind = k.name;
  r.repeat = repeat;
  const auto events = dir / "events.jsonl", metrics = dir / "metrics.jsonl";
  std::vector<std::string> args{"--config", job.string(), "--steps", std::to_string(o.steps), "--events-out",
                                events.string(), "--metrics-out", metrics.string(), "--timeout", "300"};
  args.insert(args.end(), k.flags.begin(), k.flags.end());
  const auto p = bench::run_program(apps_dir + "/oobleck-local", args, 320);
  std::ofstream(dir / "output.txt") << p.transcript();
  r.exit_status = p.status;
  analyse(bench::read_events(events), o, r);
  r.trajectory_note = trajectory_difference(read_trajectory(metrics), ref, o.steps);
  r.trajectory_equal = r.trajectory_note.empty();
  return r;
}

/// SIGTERM once step K-1 has committed, then the resumed run (see the top of this file).
run_result run_sigterm(const options& o, int repeat, const fs::path& dir, const fs::path& job, const trajectory& ref) {
  run_result r;
  r.kind = "sigterm";
  r.repeat = repeat;
  const auto events = dir / "events.jsonl", metrics = dir / "metrics.jsonl", ck = dir / "checkpoints";
  bench::event_log log(events);
  runtime::child_process local(
      apps_dir + "/oobleck-local",
      {"--config", job.string(), "--steps", std::to_string(o.steps), "--events-out", events.string(), "--metrics-out",
       metrics.string(), "--checkpoint-dir", ck.string(), "--timeout", "300"},
      runtime::child_streams{runtime::child_output::file((dir / "output.txt").string())});
  const auto before = static_cast<std::uint64_t>(o.fault_step - 1);
  const auto at = log.wait_for(
      [&](const timed_event& e) { return e.event.kind == event_kind::step_committed && e.event.step == before; }, 0, 120,
      [&] { return !local.poll(); });
  if (!at) {
    local.kill_and_reap();
    throw std::runtime_error("sigterm: step " + std::to_string(before) + " never committed (see " + dir.string() + ")");
  }
  const double t_term = bench::unix_ms_now();
  local.signal(SIGTERM);
  const auto status = local.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(120));
  r.exit_status = status ? *status : local.kill_and_reap();
  const auto stopped_events = bench::read_events(events);
  r.outcome = outcome_of(stopped_events);
  std::optional<double> last_commit;
  std::optional<std::uint64_t> last_step;
  for (const auto& e : stopped_events) {
    if (e.event.kind == event_kind::step_committed || e.event.kind == event_kind::commit_stood) {
      last_commit = e.unix_ms;
      last_step = e.event.step;
    }
    if (e.event.kind == event_kind::checkpoint_written && r.checkpoint.empty()) {
      r.detect_ms = e.unix_ms - t_term;
      r.checkpoint = e.event.detail;
      // A checkpoint of step S holds the state after steps 0..S-1: steps committed beyond it are redone.
      if (last_step && *last_step + 1 > e.event.step) r.attempts_lost = static_cast<int>(*last_step + 1 - e.event.step);
    }
  }
  if (r.checkpoint.empty()) {
    r.outcome += ", no checkpoint written";
    r.trajectory_note = "no checkpoint to resume";
    return r;
  }
  r.outcome += ", checkpoint written, resumed";
  // The resumed run: its steps replace the stopped run's from the checkpoint's step on.
  const auto events2 = dir / "events-resumed.jsonl", metrics2 = dir / "metrics-resumed.jsonl";
  const auto p = bench::run_program(apps_dir + "/oobleck-local",
                                    {"--config", job.string(), "--steps", std::to_string(o.steps), "--resume", ck.string(),
                                     "--events-out", events2.string(), "--metrics-out", metrics2.string(), "--timeout", "300"},
                                    320);
  std::ofstream(dir / "output-resumed.txt") << p.transcript();
  if (p.status != 0) {
    r.outcome += " (the resumed run exited " + std::to_string(p.status) + ")";
    r.exit_status = p.status;
  }
  const auto resumed_events = bench::read_events(events2);
  for (const auto& e : resumed_events)
    if ((e.event.kind == event_kind::step_committed || e.event.kind == event_kind::commit_stood) && last_commit) {
      r.downtime_ms = e.unix_ms - *last_commit;
      break;
    }
  const auto first = read_trajectory(metrics), second = read_trajectory(metrics2);
  trajectory joined;
  const auto resumed_from = second.loss.empty() ? std::uint64_t{0} : second.loss.begin()->first;
  for (const auto& [s, l] : first.loss)
    if (s < resumed_from) joined.loss[s] = l;
  for (const auto& s : first.repeated)
    if (s < resumed_from) joined.repeated.push_back(s);
  for (const auto& [s, l] : second.loss) joined.loss[s] = l;
  joined.repeated.insert(joined.repeated.end(), second.repeated.begin(), second.repeated.end());
  if (outcome_of(resumed_events) != "finished") r.outcome += " (resumed run: " + outcome_of(resumed_events) + ")";
  r.trajectory_note = trajectory_difference(joined, ref, o.steps);
  if (r.trajectory_note.empty() && resumed_from == 0) r.trajectory_note = "the resumed run started at step 0";
  r.trajectory_equal = r.trajectory_note.empty();
  return r;
}

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// "median [min..max]" of the runs' figures ("—" where none measured it).
std::string spread(const std::vector<double>& all, const char* f = "%.0f") {
  std::vector<double> v;
  for (double x : all)
    if (!std::isnan(x)) v.push_back(x);
  if (v.empty()) return "—";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  if (v.size() == 1 || bench::fmt(f, *lo) == bench::fmt(f, *hi)) return bench::fmt(f, v.front());
  return bench::fmt(f, median(v)) + " [" + bench::fmt(f, *lo) + ".." + bench::fmt(f, *hi) + "]";
}

/// `text` padded with spaces to `width` characters (UTF-8: "—" is one).
std::string pad(const std::string& text, std::size_t width) {
  std::size_t chars = 0;
  for (unsigned char c : text) chars += (c & 0xC0) != 0x80;
  return text + std::string(width > chars ? width - chars : 1, ' ');
}

nlohmann::json number(double x) { return std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x); }

}  // namespace

int main(int argc, char** argv) {
  int exit = 0;
  const auto parsed = parse(argc, argv, exit);
  if (!parsed) return exit;
  const options& o = *parsed;
  std::vector<kind> kinds;
  for (const auto& k : all_kinds(o)) {
    if (!o.kinds.empty()) {
      std::stringstream in(o.kinds);
      bool wanted = false;
      for (std::string part; std::getline(in, part, ',');) wanted |= part == k.name;
      if (!wanted) continue;
    }
    kinds.push_back(k);
  }
  const fs::path root = fs::temp_directory_path() / ("oobleck-fault-kinds-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  try {
    const auto job = root / "job.toml";
    std::ofstream(job) << job_text();
    const std::string load_before = bench::load_average();
    std::cout << "fault kinds: the default job (6 nodes), " << o.steps << " steps, the fault at step " << o.fault_step
              << " on node " << o.node << ", " << o.repeats << " run(s) of each kind; load " << load_before
              << std::endl;
    // The failure-free reference (and its step time).
    const auto ref_dir = root / "reference";
    fs::create_directories(ref_dir);
    const auto ref_metrics = ref_dir / "metrics.jsonl";
    const auto ref_run = bench::run_program(apps_dir + "/oobleck-local",
                                            {"--config", job.string(), "--steps", std::to_string(o.steps), "--metrics-out",
                                             ref_metrics.string(), "--timeout", "300"},
                                            320);
    const auto ref = read_trajectory(ref_metrics);
    if (ref_run.status != 0 || ref.loss.size() != static_cast<std::size_t>(o.steps))
      throw std::runtime_error("the failure-free run failed (" + std::to_string(ref_run.status) + "):\n" +
                               ref_run.transcript());
    std::vector<double> walls;
    for (const auto& r : bench::read_metrics(ref_metrics).steps) walls.push_back(r.at("wall_ms").get<double>());
    const double step_ms = median(walls);
    std::cout << "  failure-free run: " << o.steps << " steps, median step " << bench::fmt("%.1f", step_ms) << " ms"
              << std::endl;

    std::vector<run_result> results;
    for (const auto& k : kinds)
      for (int i = 0; i < o.repeats; ++i) {
        const auto dir = root / (k.name + "-" + std::to_string(i));
        fs::create_directories(dir);
        std::cout << "  " << k.name << " run " << i + 1 << "/" << o.repeats << " (load " << bench::load_average()
                  << ") ..." << std::flush;
        const auto started = std::chrono::steady_clock::now();
        auto r = k.sigterm ? run_sigterm(o, i, dir, job, ref) : run_injected(o, k, i, dir, job, ref);
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::cout << " " << bench::fmt("%.1f", took) << " s: detection " << bench::fmt("%.0f", r.detect_ms) << " ms"
                  << (std::isnan(r.lost_ms) ? "" : ", node lost " + bench::fmt("%.0f", r.lost_ms) + " ms")
                  << ", attempts lost " << r.attempts_lost << ", forms failed " << r.formations_failed << ", downtime " << bench::fmt("%.0f", r.downtime_ms)
                  << " ms, " << r.outcome << ", trajectory "
                  << (r.trajectory_equal ? "equal" : "DIFFERS: " + r.trajectory_note) << std::endl;
        results.push_back(std::move(r));
      }

    // The table: median [min..max] over the runs of each kind.
    std::cout << "\nfault kinds (median [min..max] of " << o.repeats << " run(s); ms from the commit before the faulty step;\n"
              << "SIGTERM: detection = SIGTERM to checkpoint written, downtime = to the resumed run's first commit)\n";
    std::cout << pad("kind", 43) << pad("detection ms", 19) << pad("node lost ms", 19) << pad("att. lost", 11)
              << pad("forms", 7) << pad("downtime ms", 20) << pad("trajectory", 12) << "outcome\n";
    nlohmann::json out;
    out["machine_load_before"] = load_before;
    out["steps"] = o.steps;
    out["fault_step"] = o.fault_step;
    out["node"] = o.node;
    out["repeats"] = o.repeats;
    out["failure_free_step_ms"] = step_ms;
    out["reference_losses"] = nlohmann::json::array();
    for (const auto& [s, l] : ref.loss) out["reference_losses"].push_back(l);
    bool all_equal = true;
    for (const auto& k : kinds) {
      std::vector<double> detect, node_lost, down, lost, forms;
      int equal = 0, n = 0;
      std::map<std::string, int> outcomes;
      nlohmann::json runs = nlohmann::json::array();
      for (const auto& r : results) {
        if (r.kind != k.name) continue;
        ++n;
        detect.push_back(r.detect_ms);
        node_lost.push_back(r.lost_ms);
        forms.push_back(r.formations_failed);
        down.push_back(r.downtime_ms);
        lost.push_back(r.attempts_lost);
        equal += r.trajectory_equal;
        ++outcomes[r.outcome];
        runs.push_back({{"repeat", r.repeat}, {"exit_status", r.exit_status}, {"detect_ms", number(r.detect_ms)},
                        {"node_lost_ms", number(r.lost_ms)}, {"evicted", r.evicted}, {"downtime_ms", number(r.downtime_ms)},
                        {"attempts_lost", r.attempts_lost}, {"formations_failed", r.formations_failed},
                        {"step_failed_events", r.step_failed}, {"outcome", r.outcome},
                        {"trajectory_equal", r.trajectory_equal}, {"trajectory_note", r.trajectory_note},
                        {"checkpoint", r.checkpoint}});
      }
      all_equal &= equal == n;
      std::string outcome;
      for (const auto& [text, count] : outcomes) outcome += (outcome.empty() ? "" : "; ") + text + (count < n ? " (" + std::to_string(count) + ")" : "");
      const std::string traj = equal == n ? "yes" : std::to_string(equal) + "/" + std::to_string(n);
      std::cout << pad(k.label, 43) << pad(spread(detect), 19) << pad(spread(node_lost), 19) << pad(spread(lost), 11)
                << pad(spread(forms), 7) << pad(spread(down), 20) << pad(traj, 12) << outcome << "\n";
      out["kinds"].push_back({{"kind", k.name}, {"label", k.label}, {"flags", k.flags}, {"runs", runs},
                              {"detect_ms_median", number(median(detect))}, {"node_lost_ms_median", number(median(node_lost))},
                              {"downtime_ms_median", number(median(down))}, {"attempts_lost_median", number(median(lost))},
                              {"trajectory_equal_runs", equal}});
    }
    out["machine_load_after"] = bench::load_average();
    if (!o.json_path.empty()) {
      if (const auto parent = fs::path(o.json_path).parent_path(); !parent.empty()) fs::create_directories(parent);
      std::ofstream(o.json_path) << out.dump(2) << "\n";
      std::cout << "wrote " << o.json_path << std::endl;
    }
    if (o.keep)
      std::cout << "files kept in " << root << std::endl;
    else
      fs::remove_all(root);
    if (!all_equal) {
      std::cerr << "error: a trajectory differs from the failure-free run (see the table)\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n(files kept in " << root.string() << ")\n";
    return 1;
  }
  return 0;
}
