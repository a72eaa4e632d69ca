// Issue 8's recovery benchmark: what a lost node costs on the local cluster, for a crash (SIGKILL)
// and for a hang (SIGSTOP), and a time-scaled replay of a spot-instance trace.
//
// The benchmark starts the processes itself (one oobleck-coordinator, N oobleck-worker, as
// tests/actors/local_training_e2e_test.cpp's fencing test does) so that it knows when a fault
// happens: it reads the coordinator's stdout through a pipe, stamps every line with its own
// steady clock as it arrives (the coordinator flushes each line), and sends SIGKILL / SIGSTOP to a
// worker itself half a failure-free step after a commit line. Then, on one clock:
//   detection   = fault -> the coordinator's first failure notice ("node V lost: ..." or a step /
//                 epoch failure it answers by forming the epoch again, when the data plane saw the
//                 crash first); the loss notice itself is reported too;
//   resume      = fault -> the commit line of the first step after it;
//   downtime    = the coordinator's own figure (last commit before the failure -> first commit
//                 after), and the same in failure-free steps;
// and from the coordinator's "reconfigured" metrics record: the decision (plan_ms), the bytes the
// copy plan moved, copy_ms (the slowest node's layer copies: post the buffers, receive and
// install), connect_ms and views_ms (its new mesh and stage views) and form_ms (assignments sent ->
// every node ready: all of those and the messages). The copy bandwidth is the busiest link's bytes
// over copy_ms.
// The planner's copy plan is recomputed here (same synthetic profile, same policy) to find the
// busiest link's bytes; its total is checked against the record's.
//
// Results: a table on stdout and, with --json, one object that oobleck-sim reads as recovery costs
// (--recovery-costs): detection_ms, planning_ms, copy_bytes_per_s, source, and "measured" with
// every figure. --plot draws the trace replay's throughput over time (gnuplot).
//
// usage: recovery [--quick] [--json PATH] [--plot PNG] [--bin DIR] [--trace CSV] [--time-scale X]
//                 [--transport-json PATH]

#include <torch/torch.h>  // first: glog macros

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/job_file.hpp"
#include "bench/bench_text.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "planning/synthetic_profile.hpp"
#include "runtime/device.hpp"
#include "runtime/layer_store.hpp"
#include "sim/recovery_costs.hpp"
#include "sim/replay_schedule.hpp"
#include "sim/report.hpp"
#include "sim/trace.hpp"

extern char** environ;

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using json = nlohmann::ordered_json;
namespace apps = oobleck::apps;
namespace planning = oobleck::planning;

using oobleck::bench::fmt;
using oobleck::bench::load_average;

namespace {

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------------------------------------
// A job on this machine: a coordinator and N workers, the coordinator's lines stamped on arrival.

struct stamped_line {
  clock_type::time_point t;
  std::string text;
};

class local_cluster {
 public:
  struct options {
    std::string bin;
    std::string job_text;
    int nodes = 6;
    std::int64_t steps = 20;
    int heartbeat_ms = 1000, timeout_ms = 10000;
  };

  explicit local_cluster(const options& o) : o_(o) {
    char tmpl[] = "/tmp/oobleck-bench-recovery-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a scratch directory");
    dir_ = tmpl;
    std::ofstream(dir_ / "job.toml") << o.job_text;
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    coordinator_ = spawn(o.bin + "/oobleck-coordinator",
                         {"--listen", "127.0.0.1:0", "--config", (dir_ / "job.toml").string(), "--token-file",
                          (dir_ / "token").string(), "--nodes", std::to_string(o.nodes), "--steps",
                          std::to_string(o.steps), "--metrics-out", metrics_path()},
                         fds[1], -1);
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] { read_lines(fd); });
    const auto at = wait_for([](const std::string& l) { return l.find("listening on 127.0.0.1:") != std::string::npos; },
                             0, 60);
    if (!at) throw std::runtime_error("the coordinator did not start listening:\n" + transcript());
    const std::string l = line(*at).text;
    const auto begin = l.find("127.0.0.1:");
    const std::string address = l.substr(begin, l.find(' ', begin) - begin);
    for (int i = 0; i < o.nodes; ++i) {
      const auto log = dir_ / ("w" + std::to_string(i) + ".log");
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      workers_.push_back(spawn(o.bin + "/oobleck-worker",
                               {"--coordinator", address, "--token-file", (dir_ / "token").string(), "--name",
                                "w" + std::to_string(i), "--heartbeat-interval-ms", std::to_string(o.heartbeat_ms),
                                "--connection-timeout-ms", std::to_string(o.timeout_ms)},
                               out, -1));
      ::close(out);
    }
    // Node ids are given in order of admission: map them to our processes.
    std::size_t from = 0;
    for (int joined = 0; joined < o.nodes; ++joined) {
      const auto j = wait_for([](const std::string& s) { return s.find(" joined: w") != std::string::npos; }, from, 60);
      if (!j) throw std::runtime_error("only " + std::to_string(joined) + " worker(s) joined:\n" + transcript());
      const std::string s = line(*j).text;
      const auto at_node = s.find("node ") + 5;
      const int id = std::stoi(s.substr(at_node));
      const int w = std::stoi(s.substr(s.find(" joined: w") + 10));
      node_pid_[id] = workers_.at(static_cast<std::size_t>(w));
      from = *j + 1;
    }
  }

  ~local_cluster() {
    for (pid_t p : live_) {
      ::kill(p, SIGKILL);
      ::kill(p, SIGCONT);
    }
    for (pid_t p : live_) ::waitpid(p, nullptr, 0);
    if (reader_.joinable()) reader_.join();
    std::error_code ignored;
    if (!keep_) fs::remove_all(dir_, ignored);
  }

  std::string metrics_path() const { return (dir_ / "metrics.jsonl").string(); }
  pid_t pid_of(int node) const { return node_pid_.at(node); }
  void keep_files() { keep_ = true; }
  const fs::path& dir() const { return dir_; }

  /// Sends sig to node's process; returns the time just before.
  clock_type::time_point signal(int node, int sig) {
    const auto t = clock_type::now();
    ::kill(pid_of(node), sig);
    return t;
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return lines_.size();
  }
  stamped_line line(std::size_t i) const {
    std::lock_guard lock(mu_);
    return lines_.at(i);
  }
  std::vector<stamped_line> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  std::string transcript() const {
    std::string s;
    for (const auto& l : lines()) s += l.text + "\n";
    return s;
  }

  /// The index of the first line at or after `from` that satisfies pred, waiting up to timeout_s.
  std::optional<std::size_t> wait_for(const std::function<bool(const std::string&)>& pred, std::size_t from,
                                      double timeout_s) {
    std::unique_lock lock(mu_);
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(timeout_s));
    for (std::size_t i = from;;) {
      for (; i < lines_.size(); ++i)
        if (pred(lines_[i].text)) return i;
      if (eof_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        for (; i < lines_.size(); ++i)
          if (pred(lines_[i].text)) return i;
        return std::nullopt;
      }
    }
  }

  /// Asks the coordinator to shut the job down in order (SIGTERM), then waits for its exit.
  int stop(double timeout_s = 30) {
    ::kill(coordinator_, SIGTERM);
    return wait_exit(timeout_s);
  }

  /// The coordinator's exit status (128 + signal), or -1 if it did not exit in time.
  int wait_exit(double timeout_s) {
    const auto deadline = clock_type::now() + std::chrono::duration<double>(timeout_s);
    while (clock_type::now() < deadline) {
      int status = 0;
      if (::waitpid(coordinator_, &status, WNOHANG) == coordinator_) {
        std::erase(live_, coordinator_);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  /// The metrics file: step records and "reconfigured" records.
  void read_metrics(std::vector<nlohmann::json>& steps, std::vector<nlohmann::json>& events) const {
    std::ifstream in(metrics_path());
    for (std::string l; std::getline(in, l);) {
      if (l.empty()) continue;
      auto j = nlohmann::json::parse(l);
      (j.contains("event") ? events : steps).push_back(std::move(j));
    }
  }

 private:
  pid_t spawn(const std::string& path, const std::vector<std::string>& args, int out_fd, int) {
    std::vector<char*> argv{const_cast<char*>(path.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + path + ": " + std::strerror(rc));
    live_.push_back(pid);
    return pid;
  }

  void read_lines(int fd) {
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      const auto t = clock_type::now();
      if (n <= 0) break;
      pending.append(buf, static_cast<std::size_t>(n));
      std::lock_guard lock(mu_);
      for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
        lines_.push_back({t, pending.substr(0, nl)});
        pending.erase(0, nl + 1);
      }
      cv_.notify_all();
    }
    ::close(fd);
    std::lock_guard lock(mu_);
    eof_ = true;
    cv_.notify_all();
  }

  options o_;
  fs::path dir_;
  bool keep_ = false;
  pid_t coordinator_ = -1;
  std::vector<pid_t> workers_, live_;
  std::map<int, pid_t> node_pid_;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<stamped_line> lines_;
  bool eof_ = false;
};

/// "[coordinator] step K: ..." -> K.
std::optional<long long> commit_step(const std::string& l) {
  static const std::string tag = "[coordinator] step ";
  if (l.rfind(tag, 0) != 0) return std::nullopt;
  const auto colon = l.find(": loss ", tag.size());
  if (colon == std::string::npos) return std::nullopt;
  return std::stoll(l.substr(tag.size(), colon - tag.size()));
}

bool is_failure_notice(const std::string& l) {
  return (l.find("[coordinator] node ") == 0 && l.find(" lost: ") != std::string::npos) ||
         l.find("; forming the epoch again") != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// The planner's view: the coordinator's plan of the job and its copy plans, recomputed.

struct job_model {
  apps::job_file job;
  planning::profile profile;
  planning::job_config config;

  job_model(const std::string& text, int nodes) : job(apps::parse_job(text, "job")) {
    profile = planning::synthetic_gpt_profile(apps::synthetic_model(job));
    config.nodes = nodes;
    config.fault_tolerance = job.cluster.fault_tolerance;
    config.global_batch = job.training.global_batch;
    config.microbatch = job.training.microbatch;
    config.device_memory_bytes = job.cluster.device_memory_bytes;
  }
};

/// Replays the coordinator's decisions: the initial plan on nodes 0..N-1, then one reconfiguration
/// per loss (relative to the last formed configuration, as the coordinator does).
class plan_replay {
 public:
  explicit plan_replay(const job_model& m) : m_(m), plan_(planning::plan_job(m.profile, m.config)) {
    costs_.emplace(m.profile, planning::job_memory(m.profile, m.config));
    formed_ = {plan_.pipelines, plan_.idle_nodes};
  }
  planning::reconfiguration lose(const std::vector<int>& lost) {
    const planning::reconfiguration_context ctx{plan_.templates, *costs_, m_.config.fault_tolerance,
                                                m_.config.global_batch / m_.config.microbatch, m_.config.microbatch};
    auto r = planning::reconfigure(ctx, formed_, lost, {});
    if (r.action == planning::reconfiguration_action::continue_training) formed_ = {r.pipelines, r.idle_nodes};
    return r;
  }
  const planning::cluster_state& formed() const { return formed_; }
  double predicted_step_ms() const { return plan_.step_ms; }

 private:
  const job_model& m_;
  planning::job_plan plan_;
  std::optional<planning::layer_costs> costs_;
  planning::cluster_state formed_;
};

/// The busiest link of a copy plan: the most bytes one node sends or receives.
std::int64_t busiest_link_bytes(const std::vector<planning::layer_copy>& copies) {
  std::map<int, std::int64_t> sent, received;
  for (const auto& c : copies) {
    sent[c.from_node] += c.bytes;
    received[c.to_node] += c.bytes;
  }
  std::int64_t most = 0;
  for (const auto& [n, b] : sent) most = std::max(most, b);
  for (const auto& [n, b] : received) most = std::max(most, b);
  return most;
}

// ---------------------------------------------------------------------------------------------
// Fault scenarios.

struct fault_plan {
  int step = 0;  ///< the fault happens in this step, half a failure-free step after step-1 committed
  int node = 0;
  int sig = SIGKILL;
};

struct scenario {
  std::string name;
  std::string job_name;
  std::string job_text;
  int nodes = 6;
  std::int64_t steps = 20;
  int heartbeat_ms = 1000, timeout_ms = 10000;
  std::vector<fault_plan> faults;
};

struct fault_result {
  std::string scenario, job, kind, heartbeat;
  int node = 0, step = 0;
  double step_ms = 0;               ///< failure-free step: median commit interval before the fault
  double fault_after_commit_ms = 0;
  double detect_ms = NAN;           ///< fault -> first failure notice
  double loss_notice_ms = NAN;      ///< fault -> "node V lost"
  double resume_ms = NAN;           ///< fault -> first commit after it
  double bench_downtime_ms = NAN;   ///< last commit before -> first commit after (bench clock)
  double resumed_step_ms = NAN;     ///< the re-run step's own time (its metrics wall_ms)
  json record;                      ///< the coordinator's "reconfigured" record
  std::int64_t predicted_bytes = -1, busiest_bytes = -1;
  int copies = 0;
  bool plan_matches = false;
  std::vector<std::string> notes;
};

std::vector<fault_result> run_scenario(const std::string& bin, const scenario& s, int& spurious_losses) {
  std::cout << "  " << s.name << " (" << s.job_name << ", " << s.nodes << " nodes, heartbeat " << s.heartbeat_ms
            << " ms / timeout " << s.timeout_ms << " ms; load " << load_average() << ") ..." << std::flush;
  const auto started = clock_type::now();
  local_cluster c({bin, s.job_text, s.nodes, s.steps, s.heartbeat_ms, s.timeout_ms});
  std::vector<fault_result> results;
  std::map<long long, clock_type::time_point> commits;  // first commit line of each step
  std::size_t cursor = 0;
  auto note_commits = [&](std::size_t upto) {
    for (std::size_t i = 0; i < upto; ++i) {
      const auto l = c.line(i);
      if (auto k = commit_step(l.text); k && !commits.count(*k)) commits[*k] = l.t;
    }
  };
  auto fail = [&](const std::string& what) {
    c.keep_files();
    throw std::runtime_error(s.name + ": " + what + " (files in " + c.dir().string() + ")\n" + c.transcript());
  };
  const double patience = s.timeout_ms / 1000.0 + 60;
  for (const auto& f : s.faults) {
    const auto at = c.wait_for([&](const std::string& l) { return commit_step(l) == f.step - 1; }, cursor, 120);
    if (!at) fail("step " + std::to_string(f.step - 1) + " never committed");
    note_commits(*at + 1);
    std::vector<double> intervals;
    for (long long k = 2; k < f.step; ++k)
      if (commits.count(k) && commits.count(k - 1)) intervals.push_back(ms_between(commits[k - 1], commits[k]));
    fault_result r;
    r.scenario = s.name;
    r.job = s.job_name;
    r.kind = f.sig == SIGKILL ? "kill -9" : "hang (SIGSTOP)";
    r.heartbeat = std::to_string(s.heartbeat_ms) + "/" + std::to_string(s.timeout_ms);
    r.node = f.node;
    r.step = f.step;
    r.step_ms = median(intervals);
    const auto last_commit = c.line(*at).t;
    std::this_thread::sleep_until(last_commit + std::chrono::duration_cast<clock_type::duration>(
                                                    std::chrono::duration<double, std::milli>(r.step_ms / 2)));
    const std::size_t before = c.size();
    const auto t_fault = c.signal(f.node, f.sig);
    r.fault_after_commit_ms = ms_between(last_commit, t_fault);
    const auto notice = c.wait_for(is_failure_notice, before, patience);
    if (!notice) fail("no failure notice after the fault");
    r.detect_ms = ms_between(t_fault, c.line(*notice).t);
    const std::string lost = "[coordinator] node " + std::to_string(f.node) + " lost: ";
    const auto lost_at = c.wait_for([&](const std::string& l) { return l.rfind(lost, 0) == 0; }, before, patience);
    if (!lost_at) fail("node " + std::to_string(f.node) + " was never declared lost");
    r.loss_notice_ms = ms_between(t_fault, c.line(*lost_at).t);
    const auto resumed = c.wait_for([](const std::string& l) { return commit_step(l).has_value(); }, before, 120);
    if (!resumed) fail("no step committed after the fault");
    r.resume_ms = ms_between(t_fault, c.line(*resumed).t);
    r.bench_downtime_ms = ms_between(last_commit, c.line(*resumed).t);
    cursor = *resumed + 1;
    if (f.sig == SIGSTOP) {  // it was replaced: end it (it would be fenced and exit on waking)
      ::kill(c.pid_of(f.node), SIGKILL);
      ::kill(c.pid_of(f.node), SIGCONT);
    }
    results.push_back(std::move(r));
  }
  const auto finished = c.wait_for([](const std::string& l) { return l.find("training finished") != std::string::npos; },
                                   cursor, 300);
  if (!finished) fail("the job did not finish");
  const int status = c.wait_exit(60);
  if (status != 0) fail("the coordinator exited with status " + std::to_string(status));

  std::vector<nlohmann::json> steps, events;
  c.read_metrics(steps, events);
  // Losses nobody caused (a heartbeat timeout on a healthy, descheduled node).
  for (const auto& l : c.lines()) {
    if (l.text.rfind("[coordinator] node ", 0) != 0 || l.text.find(" lost: ") == std::string::npos) continue;
    const int id = std::stoi(l.text.substr(19));
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
    std::vector<int> lost;
    for (const auto& n : e["lost"]) lost.push_back(n.get<int>());
    const auto r = lost.empty() ? planning::reconfiguration{} : replay.lose(lost);
    for (std::size_t i = next; i < results.size(); ++i) {
      if (std::find(lost.begin(), lost.end(), results[i].node) == lost.end()) continue;
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

// ---------------------------------------------------------------------------------------------
/// "250/1500": the job's default heartbeat interval and connection timeout, in ms.
std::string default_heartbeat() {
  const apps::cluster_section d;
  return std::to_string(d.heartbeat_interval_ms) + "/" + std::to_string(d.connection_timeout_ms);
}

// Trace replay: a sample of the trace's starting nodes, their removals as kills, time-scaled.

struct replay_kill {
  double trace_ms = 0;
  std::vector<std::string> names;
  std::vector<int> nodes;
};

struct replay_run {
  std::vector<double> commit_s;  ///< commit times after the first epoch formed
  int samples_per_step = 0;
  std::vector<double> kill_s;
  std::vector<nlohmann::json> events;
  int status = 0;
};

replay_run run_replay(const std::string& bin, const std::string& job_text, int nodes, double window_s,
                      const std::vector<replay_kill>& kills, double scale, int samples_per_step) {
  // Stopped by SIGTERM at the window's end; the step count only bounds how long the job would
  // outlive a benchmark killed from outside (steps here take tens of ms, never 5).
  const auto max_steps = static_cast<std::int64_t>(std::max(1000.0, window_s * 200));
  local_cluster c({bin, job_text, nodes, max_steps, 1000, 10000});
  replay_run run;
  run.samples_per_step = samples_per_step;
  const auto formed = c.wait_for([](const std::string& l) { return l.find("epoch 1 formed") != std::string::npos; }, 0, 120);
  if (!formed) {
    c.keep_files();
    throw std::runtime_error("trace replay: the first epoch never formed\n" + c.transcript());
  }
  const auto t0 = c.line(*formed).t;
  for (const auto& k : kills) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<clock_type::duration>(
                                           std::chrono::duration<double, std::milli>(k.trace_ms * scale)));
    for (int n : k.nodes) run.kill_s.push_back(ms_between(t0, c.signal(n, SIGKILL)) / 1000);
  }
  std::this_thread::sleep_until(t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(window_s)));
  const auto end = clock_type::now();
  run.status = c.stop();
  for (const auto& l : c.lines())
    if (commit_step(l.text) && l.t <= end) run.commit_s.push_back(ms_between(t0, l.t) / 1000);
  std::vector<nlohmann::json> steps;
  c.read_metrics(steps, run.events);
  return run;
}

std::vector<double> throughput_series(const replay_run& r, double window_s, double bin_s) {
  std::vector<double> s(static_cast<std::size_t>(std::ceil(window_s / bin_s)), 0.0);
  for (double t : r.commit_s) {
    const auto i = static_cast<std::size_t>(t / bin_s);
    if (i < s.size()) s[i] += r.samples_per_step;
  }
  for (std::size_t i = 0; i < s.size(); ++i) s[i] /= std::min(bin_s, window_s - i * bin_s);  // the last bin may be short
  return s;
}

void plot_replay(const std::string& png, const std::string& title, double bin_s, const std::vector<double>& free_run,
                 const std::vector<double>& replay, const std::vector<double>& kills, double free_avg, double replay_avg,
                 std::size_t) {
  const std::string gnuplot = oobleck::sim::find_gnuplot();
  if (gnuplot.empty()) {
    std::cout << "gnuplot is not on PATH: no plot (Debian: apt-get install gnuplot-nox)\n";
    return;
  }
  const fs::path dir = fs::temp_directory_path() / ("oobleck-bench-recovery-plot-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "series.dat");
    for (std::size_t i = 0; i < free_run.size() && i < replay.size(); ++i)
      f << (i + 0.5) * bin_s << " " << free_run[i] << " " << replay[i] << "\n";  // bin centres
  }
  {
    std::ofstream f(dir / "plot.gp");
    f << "set terminal pngcairo size 1000,500 noenhanced\n";
    f << "set output '" << png << "'\n";
    f << "set title '" << title << "'\n";
    f << "set xlabel 'time since the first epoch formed (s, local)'\nset ylabel 'throughput (samples/s)'\n";
    f << "set xrange [0:" << free_run.size() * bin_s << "]\nset yrange [0:*]\nset grid\nset key bottom left\n";
    for (double k : kills) f << "set arrow from " << k << ", graph 0 to " << k << ", graph 1 nohead dt 2 lc rgb 'red'\n";
    f << "plot '" << (dir / "series.dat").string() << "' using 1:2 with lines lw 2 title 'failure-free ("
      << fmt("%.1f", free_avg) << " samples/s)', '' using 1:3 with lines lw 2 title 'trace removals as kills ("
      << fmt("%.1f", replay_avg) << " samples/s; red: kills)'\n";
  }
  const int rc = std::system(("'" + gnuplot + "' '" + (dir / "plot.gp").string() + "' 2>&1").c_str());
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  if (rc != 0) throw std::runtime_error("gnuplot failed (status " + std::to_string(rc) + ")");
  std::cout << "plot: " << png << "\n";
}

// ---------------------------------------------------------------------------------------------

/// The per-byte work of a layer copy outside the transport, in this process (one intra-op thread):
/// serialize_layer (copy into one buffer + checksum) on the sender, install_layer (checksum +
/// copy into the store) on the receiver, and a plain memcpy of the same bytes for scale.
struct copy_path {
  double bytes = 0, serialize_ms = 0, install_ms = 0, memcpy_ms = 0;
};

copy_path measure_copy_path(const apps::job_file& job, int layer) {
  oobleck::runtime::use_one_compute_thread();
  oobleck::runtime::layer_store sender(job.model), receiver(job.model);
  sender.ensure(layer);
  std::vector<double> ser, ins, cpy;
  std::vector<std::byte> bytes;
  for (int i = 0; i < 7; ++i) {
    auto t = clock_type::now();
    bytes = sender.serialize_layer(layer);
    ser.push_back(ms_between(t, clock_type::now()));
    t = clock_type::now();
    receiver.install_layer(layer, bytes);
    ins.push_back(ms_between(t, clock_type::now()));
    std::vector<std::byte> copy(bytes.size());
    t = clock_type::now();
    std::memcpy(copy.data(), bytes.data(), bytes.size());
    cpy.push_back(ms_between(t, clock_type::now()));
  }
  return {static_cast<double>(bytes.size()), median(ser), median(ins), median(cpy)};
}

std::string default_job_text(const std::string& bin) {
  const std::string cmd = "'" + bin + "/oobleck-local' --print-default-job";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + cmd);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  if (::pclose(p) != 0 || text.empty()) throw std::runtime_error(cmd + " failed");
  return text;
}

/// Sets `key = value` in the text's [section] (replacing the key's line, or adding it).
std::string with_key(std::string text, const std::string& section, const std::string& key, const std::string& value) {
  const auto s = text.find("[" + section + "]");
  if (s == std::string::npos) return text + "\n[" + section + "]\n" + key + " = " + value + "\n";
  const auto next = text.find("\n[", s + 1);
  const auto k = text.find("\n" + key + " =", s);
  if (k != std::string::npos && (next == std::string::npos || k < next)) {
    const auto eol = text.find('\n', k + 1);
    return text.replace(k + 1, eol - k - 1, key + " = " + value);
  }
  const auto eol = text.find('\n', s);
  return text.insert(eol + 1, key + " = " + value + "\n");
}

/// The host transport's point-to-point bandwidth (GB/s) at the size nearest to `bytes`, from
/// transport_vs_gloo's JSON.
std::optional<std::pair<double, std::int64_t>> p2p_gbps(const std::string& path, double bytes) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("rows")) return std::nullopt;
  std::optional<std::pair<double, std::int64_t>> best;
  double best_d = 1e300;
  for (const auto& r : j["rows"]) {
    if (r.value("op", "") != "p2p" || r.value("impl", "") != "host") continue;
    const double d = std::abs(std::log(r["bytes"].get<double>() / std::max(bytes, 1.0)));
    if (d < best_d) {
      best_d = d;
      best = std::pair{r["gbps"].get<double>(), r["bytes"].get<std::int64_t>()};
    }
  }
  return best;
}

json result_json(const fault_result& r, double p2p) {
  json j;
  j["scenario"] = r.scenario;
  j["job"] = r.job;
  j["fault"] = r.kind;
  j["heartbeat_ms"] = r.heartbeat;
  j["node"] = r.node;
  j["step"] = r.step;
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
    const double bytes = r.record["copy_bytes"].get<double>();
    j["copy_gb_per_s"] = copy_ms > 0 ? bytes / copy_ms / 1e6 : 0;  // all links together
    j["busiest_link_gb_per_s"] = copy_ms > 0 ? static_cast<double>(r.busiest_bytes) / copy_ms / 1e6 : 0;
    j["downtime_steps"] = r.record["downtime_ms"].get<double>() / r.step_ms;
    j["downtime_bound_ms"] = r.detect_ms + r.step_ms + copy_ms + 500;
    if (p2p > 0 && copy_ms > 0) j["copy_vs_p2p"] = static_cast<double>(r.busiest_bytes) / copy_ms / 1e6 / p2p;
  }
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j;
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  std::string json_path, plot_path, bin = OOBLECK_APPS_DIR;
  std::string trace_path = std::string(OOBLECK_TRACES_DIR) + "/bamboo-p3-trace.csv";
  std::string transport_json = std::string(OOBLECK_SOURCE_DIR) + "/bench/results/transport_vs_gloo.json";
  std::string transport_label = "bench/results/transport_vs_gloo.json";
  double time_scale = 0.005;
  bool scale_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") quick = true;
    else if (a == "--json") json_path = value();
    else if (a == "--plot") plot_path = value();
    else if (a == "--bin") bin = value();
    else if (a == "--trace") trace_path = value();
    else if (a == "--transport-json") transport_json = transport_label = value();
    else if (a == "--time-scale") time_scale = std::stod(value()), scale_given = true;
    else {
      std::cout << "usage: recovery [--quick] [--json PATH] [--plot PNG] [--bin DIR] [--trace CSV] [--time-scale X]\n"
                   "                [--transport-json PATH]\n"
                   "  Crash (kill -9) and hang (SIGSTOP) of a worker on the local cluster: detection, decision,\n"
                   "  copy and downtime; then the trace's removals replayed as kills, time-scaled (default 0.005;\n"
                   "  --quick: 0.001 and fewer scenarios). --json writes oobleck-sim's recovery-costs file.\n";
      return a == "--help" ? 0 : 2;
    }
  }
  if (quick && !scale_given) time_scale = 0.001;
  const auto bench_started = clock_type::now();
  const std::string load_start = load_average();
  std::cout << "recovery benchmark" << (quick ? " (quick)" : "") << ", load average " << load_start << "\n";

  const std::string small_job = default_job_text(bin);
  std::string large_job = with_key(small_job, "model", "d_model", "128");
  large_job = with_key(large_job, "model", "heads", "4");
  large_job = with_key(large_job, "model", "blocks", "12");
  large_job = with_key(large_job, "cluster", "device_memory_bytes", "25165824");
  // For the copy bandwidth: a model whose copies are tens of MB (per block 9.4 MB of state).
  std::string xl_job = with_key(small_job, "model", "d_model", "256");
  xl_job = with_key(xl_job, "model", "heads", "4");
  xl_job = with_key(xl_job, "model", "blocks", "8");
  xl_job = with_key(xl_job, "cluster", "device_memory_bytes", "67108864");
  // Every scenario runs the job's default heartbeats (cluster.heartbeat_interval_ms and
  // connection_timeout_ms), in the job file and on the workers' flags alike.
  const apps::cluster_section defaults;
  const int hb = defaults.heartbeat_interval_ms, to = defaults.connection_timeout_ms;
  const std::string hang_name = "hang, default " + default_heartbeat() + " ms";

  std::vector<scenario> scenarios;
  if (quick) {
    scenarios.push_back({"crash", "default", small_job, 6, 12, hb, to, {{6, 2, SIGKILL}}});
    scenarios.push_back({hang_name, "default", small_job, 6, 12, hb, to, {{6, 2, SIGSTOP}}});
  } else {
    scenarios.push_back({"crash", "default", small_job, 6, 50, hb, to, {{15, 2, SIGKILL}, {35, 4, SIGKILL}}});
    scenarios.push_back({"crash", "large", large_job, 6, 16, hb, to, {{5, 2, SIGKILL}, {11, 4, SIGKILL}}});
    scenarios.push_back({"crash", "xl", xl_job, 6, 12, hb, to, {{4, 2, SIGKILL}, {9, 4, SIGKILL}}});
    scenarios.push_back({hang_name, "default", small_job, 6, 50, hb, to, {{15, 2, SIGSTOP}, {35, 4, SIGSTOP}}});
    scenarios.push_back({hang_name, "large", large_job, 6, 10, hb, to, {{5, 2, SIGSTOP}}});
  }
  std::vector<fault_result> results;
  int spurious = 0;
  for (const auto& s : scenarios)
    for (auto& r : run_scenario(bin, s, spurious)) results.push_back(std::move(r));

  // --- the table
  auto record_ms = [](const fault_result& r, const char* key) {
    return r.record.is_null() || !r.record.contains(key) ? std::nan("") : r.record[key].get<double>();
  };
  double mean_copy_bytes = 0;
  int with_copies = 0;
  for (const auto& r : results)
    if (!r.record.is_null() && r.copies > 0) {
      mean_copy_bytes += r.record["copy_bytes"].get<double>() / r.copies;
      ++with_copies;
    }
  mean_copy_bytes = with_copies ? mean_copy_bytes / with_copies : 0;
  const auto p2p = p2p_gbps(transport_json, mean_copy_bytes);
  const double p2p_gb = p2p ? p2p->first : 0;
  std::cout << "\nper fault (ms unless stated; detect: fault -> the coordinator's first failure notice, bench clock;\n"
               "decide, copy, downtime: the coordinator's record; GB/s: the busiest link's bytes / copy; step: failure-free commit interval before it)\n";
  std::printf("%-28s %-8s %-14s %4s %7s %8s %8s %7s %10s %7s %8s %8s %9s %6s %7s\n", "scenario", "job", "fault", "node",
              "step", "detect", "lost", "decide", "copy B", "copy", "GB/s", "resume", "downtime", "steps", "bound");
  for (const auto& r : results) {
    const double copy_ms = record_ms(r, "copy_ms"), down = record_ms(r, "downtime_ms");
    const double bytes = r.record.is_null() ? NAN : r.record["copy_bytes"].get<double>();
    const double bound = r.detect_ms + r.step_ms + copy_ms + 500;
    const std::string gbps = r.busiest_bytes > 0 ? fmt("%.3f", static_cast<double>(r.busiest_bytes) / copy_ms / 1e6) : "-";
    std::printf("%-28s %-8s %-14s %4d %7.1f %8.1f %8.1f %7.3f %10.0f %7.1f %8s %8.1f %9.1f %6.2f %7s\n",
                r.scenario.c_str(), r.job.c_str(), r.kind.c_str(), r.node, r.step_ms, r.detect_ms, r.loss_notice_ms,
                record_ms(r, "plan_ms"), bytes, copy_ms, gbps.c_str(), r.resume_ms, down, down / r.step_ms,
                down <= bound ? "met" : "MISSED");
  }

  std::cout << "\nwhere the copies go (ms, the coordinator's record; each the slowest node's): copy = copy_ms (a receiver's\n"
               "span from telling its sources it is ready, once its links to them are up, to its layers installed); wait = the\n"
               "part of it before the first message of every source had arrived (senders' skew); rest = receive + install;\n"
               "connect = the whole mesh; prepare = allocating and pre-faulting the incoming layers (before the mesh connects)\n";
  std::printf("%-28s %-8s %4s %10s %10s %7s %7s %7s %8s %8s %8s\n", "scenario", "job", "node", "copy B", "busiest B",
              "copy", "wait", "rest", "GB/s", "connect", "prepare");
  for (const auto& r : results) {
    if (r.record.is_null()) continue;
    const double copy_ms = record_ms(r, "copy_ms"), wait_ms = record_ms(r, "copy_wait_ms");
    const std::string gbps = r.busiest_bytes > 0 ? fmt("%.3f", static_cast<double>(r.busiest_bytes) / copy_ms / 1e6) : "-";
    std::printf("%-28s %-8s %4d %10.0f %10lld %7.1f %7.1f %7.1f %8s %8.1f %8.1f\n", r.scenario.c_str(), r.job.c_str(),
                r.node, r.record["copy_bytes"].get<double>(), static_cast<long long>(r.busiest_bytes), copy_ms, wait_ms,
                copy_ms - wait_ms, gbps.c_str(), record_ms(r, "connect_ms"), record_ms(r, "prepare_ms"));
  }

  std::cout << "\nwhere the downtime goes (ms): the lost part of the interrupted step, detection, first notice ->\n"
               "the re-run step's start (decision + new epoch: mesh, copies, views), the re-run step (new configuration)\n";
  std::printf("%-28s %-8s %-14s %4s %8s %8s %10s %8s %9s\n", "scenario", "job", "fault", "node", "partial", "detect",
              "reconfig", "re-run", "downtime");
  for (const auto& r : results)
    std::printf("%-28s %-8s %-14s %4d %8.1f %8.1f %10.1f %8.1f %9.1f\n", r.scenario.c_str(), r.job.c_str(), r.kind.c_str(),
                r.node, r.fault_after_commit_ms, r.detect_ms, r.resume_ms - r.resumed_step_ms - r.detect_ms,
                r.resumed_step_ms, record_ms(r, "downtime_ms"));

  // --- copy time against the busiest link's bytes: fixed part (mesh, views) and marginal bandwidth
  std::vector<std::pair<double, double>> pts;  // (busiest bytes, copy_ms)
  for (const auto& r : results)
    if (!r.record.is_null() && r.plan_matches) pts.emplace_back(static_cast<double>(r.busiest_bytes), r.record["copy_ms"].get<double>());
  // Theil-Sen (robust to a descheduled process): the median of the slopes between events whose
  // sizes differ at least twofold, and the median intercept.
  double fit_fixed_ms = NAN, fit_bytes_per_ms = NAN;
  {
    std::vector<double> slopes;  // ms per byte
    for (std::size_t a = 0; a < pts.size(); ++a)
      for (std::size_t b = 0; b < pts.size(); ++b)
        if (pts[b].first >= 2 * pts[a].first && pts[a].first > 0)
          slopes.push_back((pts[b].second - pts[a].second) / (pts[b].first - pts[a].first));
    const double slope = median(slopes);
    if (std::isfinite(slope) && slope > 0) {
      fit_bytes_per_ms = 1 / slope;
      std::vector<double> intercepts;
      for (auto [x, y] : pts) intercepts.push_back(y - x * slope);
      fit_fixed_ms = median(intercepts);
    }
  }

  // --- summaries and targets
  auto pick = [&](const std::function<bool(const fault_result&)>& f, const std::function<double(const fault_result&)>& g) {
    std::vector<double> v;
    for (const auto& r : results)
      if (f(r)) v.push_back(g(r));
    return v;
  };
  auto is_crash = [](const fault_result& r) { return r.kind == "kill -9"; };
  auto is_hang_default = [](const fault_result& r) { return r.kind != "kill -9" && r.heartbeat == default_heartbeat(); };
  auto is_hang_short = [](const fault_result& r) { return r.kind != "kill -9" && r.heartbeat != default_heartbeat(); };
  auto has_record = [](const fault_result& r) { return !r.record.is_null(); };
  const auto crash_detect = pick(is_crash, [](const fault_result& r) { return r.detect_ms; });
  const auto crash_lost = pick(is_crash, [](const fault_result& r) { return r.loss_notice_ms; });
  const auto hang_default = pick(is_hang_default, [](const fault_result& r) { return r.loss_notice_ms; });
  const auto hang_short = pick(is_hang_short, [](const fault_result& r) { return r.loss_notice_ms; });
  const auto decisions = pick(has_record, [](const fault_result& r) { return r.record["plan_ms"].get<double>(); });
  // Per link: the busiest link's bytes over the slowest node's copy time (the links run at once, so
  // all bytes over that time would credit parallelism, not the transport).
  const auto bandwidths = pick([](const fault_result& r) { return !r.record.is_null() && r.busiest_bytes > 0 && r.record["copy_ms"].get<double>() > 0; },
                               [](const fault_result& r) { return r.busiest_bytes / r.record["copy_ms"].get<double>() / 1e6; });
  int bound_met = 0, bound_total = 0;
  for (const auto& r : results)
    if (!r.record.is_null()) {
      ++bound_total;
      bound_met += r.record["downtime_ms"].get<double>() <= r.detect_ms + r.step_ms + r.record["copy_ms"].get<double>() + 500;
    }
  auto max_of = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::max_element(v.begin(), v.end()); };
  auto min_of = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::min_element(v.begin(), v.end()); };
  json targets = json::array();
  auto target = [&](const std::string& what, const std::string& goal, double value, bool met) {
    targets.push_back({{"what", what}, {"target", goal}, {"measured", value}, {"met", met}});
    std::printf("  %-58s %-22s %10.2f  %s\n", what.c_str(), goal.c_str(), value, met ? "met" : "NOT MET");
  };
  std::cout << "\ntargets (worst case over the events above)\n";
  target("crash detected (kill -9 -> first failure notice), ms", "<= 100", max_of(crash_detect), max_of(crash_detect) <= 100);
  if (!hang_default.empty())
    target("hang detected, default heartbeat " + default_heartbeat() + " ms, ms", "<= 2000", max_of(hang_default), max_of(hang_default) <= 2000);
  if (!hang_short.empty())
    target("hang detected, other heartbeat settings, ms", "<= 2000", max_of(hang_short), max_of(hang_short) <= 2000);
  target("reconfiguration decision, ms", "<= 10", max_of(decisions), max_of(decisions) <= 10);
  target("events with downtime <= detect + step + copy + 500 ms", "all " + std::to_string(bound_total), bound_met,
         bound_met == bound_total && bound_total > 0);
  if (p2p)
    target("copy bandwidth (busiest link's bytes / copy_ms) / host p2p " + fmt("%.2f", p2p_gb) + " GB/s", ">= 0.5",
           max_of(bandwidths) / p2p_gb, max_of(bandwidths) / p2p_gb >= 0.5);
  if (!std::isnan(fit_bytes_per_ms))
    std::cout << "copy_ms against the busiest link's bytes: " << fmt("%.1f", fit_fixed_ms) << " ms + bytes / "
              << fmt("%.3f", fit_bytes_per_ms / 1e6) << " GB/s (fixed part: per-copy serialisation, messages, installs)\n";
  if (spurious) std::cout << "spurious losses (a healthy node timed out): " << spurious << "\n";
  const auto path = measure_copy_path(apps::parse_job(quick ? small_job : xl_job, "job"), 1);
  std::cout << "copy path outside the transport, one block of the " << (quick ? "default" : "xl") << " model ("
            << fmt("%.0f", path.bytes) << " bytes, this process, idle peers): serialize " << fmt("%.2f", path.serialize_ms)
            << " ms (" << fmt("%.2f", path.bytes / path.serialize_ms / 1e6) << " GB/s), install "
            << fmt("%.2f", path.install_ms) << " ms (" << fmt("%.2f", path.bytes / path.install_ms / 1e6)
            << " GB/s), memcpy " << fmt("%.2f", path.memcpy_ms) << " ms ("
            << fmt("%.2f", path.bytes / path.memcpy_ms / 1e6) << " GB/s)\n";


  // --- trace replay
  json replay_json;
  if (!fs::exists(trace_path)) {
    std::cout << "\ntrace replay: " << trace_path << " not found: skipped\n";
    replay_json = {{"trace", trace_path}, {"skipped", "trace not found"}};
  } else {
    const auto events = oobleck::sim::read_trace(trace_path);
    const int nodes = 8;
    // The trace's first 8 starting nodes (file order) and their removals (sim/replay_schedule.hpp,
    // as oobleck-local --trace schedules them, without the joins).
    const auto schedule = oobleck::sim::make_replay_schedule(events, {.slots = nodes, .joins = false});
    const std::vector<std::string>& sample = schedule.initial;
    const std::string replay_job = with_key(small_job, "cluster", "nodes", std::to_string(nodes));
    const job_model model(replay_job, nodes);
    plan_replay planner(model);
    std::vector<replay_kill> kills;
    double end_trace_ms = schedule.end_ms;
    std::string end_reason = "the trace's end";
    const int adds_ignored = schedule.adds_without_slot, removes_elsewhere = schedule.removes_without_worker;
    for (const auto& e : schedule.events) {
      const replay_kill k{e.ms, e.removed, e.killed};
      const auto r = planner.lose(k.nodes);
      if (r.action == planning::reconfiguration_action::checkpoint_and_stop) {
        end_trace_ms = e.ms;
        std::string names;
        for (const auto& n : k.names) names += " " + n;
        end_reason = "the removal of" + names + " at " + fmt("%.0f", e.ms / 1000) + " s, which the job cannot survive (" +
                     r.reason + ")";
        break;
      }
      kills.push_back(k);
    }
    const double window_s = end_trace_ms * time_scale / 1000;
    std::cout << "\ntrace replay: " << trace_path << ", nodes";
    for (std::size_t i = 0; i < sample.size(); ++i) std::cout << " " << sample[i] << "->" << i;
    std::cout << "; time scale " << time_scale << "; window " << fmt("%.0f", end_trace_ms / 1000) << " s of trace = "
              << fmt("%.1f", window_s) << " s, ending at " << end_reason << "\n";
    for (const auto& k : kills) {
      std::cout << "  kill at trace " << fmt("%.0f", k.trace_ms / 1000) << " s (local " << fmt("%.2f", k.trace_ms * time_scale / 1000)
                << " s):";
      for (std::size_t j = 0; j < k.nodes.size(); ++j) std::cout << " " << k.names[j] << " (node " << k.nodes[j] << ")";
      std::cout << "\n";
    }
    const int spb = model.job.training.global_batch;
    // Failure-free and replay runs alternate (A B B A in the full run) so that a change of the
    // machine's load from other work weighs on both alike.
    const std::vector<bool> order = quick ? std::vector<bool>{false, true} : std::vector<bool>{false, true, true, false};
    std::vector<replay_run> free_runs, replays;
    for (bool with_kills : order) {
      std::cout << (with_kills ? "  replay ..." : "  failure-free run ...") << std::flush;
      auto r = run_replay(bin, replay_job, nodes, window_s, with_kills ? kills : std::vector<replay_kill>{}, time_scale, spb);
      std::cout << " " << r.commit_s.size() << " steps, load " << load_average() << "\n";
      (with_kills ? replays : free_runs).push_back(std::move(r));
    }
    const double bin_s = quick ? 0.25 : 1.0;
    auto mean_series = [&](const std::vector<replay_run>& runs) {
      std::vector<double> m;
      for (const auto& r : runs) {
        const auto s = throughput_series(r, window_s, bin_s);
        if (m.empty()) m.assign(s.size(), 0.0);
        for (std::size_t i = 0; i < s.size(); ++i) m[i] += s[i] / runs.size();
      }
      return m;
    };
    auto averages = [&](const std::vector<replay_run>& runs) {
      std::vector<double> v;
      for (const auto& r : runs) v.push_back(r.commit_s.size() * spb / window_s);
      return v;
    };
    const auto free_avgs = averages(free_runs), replay_avgs = averages(replays);
    double free_avg = 0, replay_avg = 0;
    for (double x : free_avgs) free_avg += x / free_avgs.size();
    for (double x : replay_avgs) replay_avg += x / replay_avgs.size();
    const auto free_series = mean_series(free_runs);
    const auto replay_series = mean_series(replays);
    const auto& replay = replays.front();
    // What the recoveries themselves cost: time from each last commit before a loss to the first
    // commit after it, less one step, as a share of the window.
    std::vector<double> free_steps;
    for (const auto& r : free_runs)
      for (std::size_t i = 1; i < r.commit_s.size(); ++i) free_steps.push_back((r.commit_s[i] - r.commit_s[i - 1]) * 1000);
    const double free_step_ms = median(free_steps);
    std::vector<double> lost_shares;
    json recs = json::array();
    for (const auto& r : replays) {
      double lost_ms = 0;
      json one = json::array();
      for (const auto& e : r.events) {
        lost_ms += std::max(0.0, e["downtime_ms"].get<double>() - free_step_ms);
        one.push_back(json::parse(e.dump()));
      }
      recs.push_back(one);
      lost_shares.push_back(lost_ms / 1000 / window_s);
    }
    std::cout << "  average throughput: failure-free " << fmt("%.1f", free_avg) << " samples/s, replay "
              << fmt("%.1f", replay_avg) << " samples/s: " << fmt("%.3f", replay_avg / free_avg)
              << " of the failure-free run (" << kills.size() << " removal event(s) replayed; " << adds_ignored
              << " nodes of the trace outside the sample, their adds not replayed here (oobleck-local --trace and "
                 "bench/sim_validation replay joins); "
              << removes_elsewhere << " removals of nodes outside the sample)\n"
              << "  recoveries (downtime less one failure-free step of " << fmt("%.1f", free_step_ms)
              << " ms) took " << fmt("%.2f", 100 * median(lost_shares)) << "% of the window\n";
    if (!plot_path.empty())
      plot_replay(plot_path,
                  "default job, " + std::to_string(nodes) + " local nodes: " + fs::path(trace_path).filename().string() +
                      " removals x" + fmt("%g", time_scale) + ", mean of " + std::to_string(replays.size()) +
                      " run(s) each (" + fmt("%.3f", replay_avg / free_avg) + " of failure-free)",
                  bin_s, free_series, replay_series, replay.kill_s, free_avg, replay_avg, replays.size());
    json ks = json::array();
    for (const auto& k : kills) ks.push_back({{"trace_s", k.trace_ms / 1000}, {"names", k.names}, {"nodes", k.nodes}});
    replay_json = {{"trace", trace_path},
                   {"nodes", nodes},
                   {"sample", sample},
                   {"time_scale", time_scale},
                   {"window_trace_s", end_trace_ms / 1000},
                   {"window_s", window_s},
                   {"ends_at", end_reason},
                   {"kills", ks},
                   {"kill_local_s", replay.kill_s},
                   {"adds_not_replayed", adds_ignored},
                   {"removals_outside_sample", removes_elsewhere},
                   {"failure_free_samples_per_s", free_avg},
                   {"replay_samples_per_s", replay_avg},
                   {"relative_throughput", replay_avg / free_avg},
                   {"failure_free_runs_samples_per_s", free_avgs},
                   {"replay_runs_samples_per_s", replay_avgs},
                   {"failure_free_step_ms", free_step_ms},
                   {"recovery_share_of_window", lost_shares},
                   {"reconfigured_per_replay", recs},
                   {"bin_s", bin_s},
                   {"failure_free_series", free_series},
                   {"replay_series", replay_series}};
  }

  // --- the recovery-costs file
  const double detection = median(crash_detect);
  std::vector<double> reconfig;  // first notice -> the resumed step's start, less the copy's marginal time
  for (const auto& r : results) {
    if (!is_crash(r) || r.record.is_null() || std::isnan(r.resumed_step_ms)) continue;
    const double to_start = r.resume_ms - r.resumed_step_ms - r.detect_ms;
    const double copy_part = std::isnan(fit_bytes_per_ms) ? 0 : r.busiest_bytes / fit_bytes_per_ms;
    reconfig.push_back(std::max(0.0, to_start - copy_part));
  }
  const double planning_ms = median(reconfig);
  double copy_bps = std::isnan(fit_bytes_per_ms) ? NAN : fit_bytes_per_ms * 1e3;
  std::string copy_how = "marginal: Theil-Sen slope of copy_ms against the busiest link's bytes over every event (pairs differing >= 2x in size)";
  if (std::isnan(copy_bps)) {  // one size only: the effective figure (fixed costs included)
    std::vector<double> eff;
    for (const auto& r : results)
      if (!r.record.is_null() && r.busiest_bytes > 0) eff.push_back(r.busiest_bytes / r.record["form_ms"].get<double>() * 1e3);
    copy_bps = median(eff);
    copy_how = "effective: the busiest link's bytes / form_ms (mesh connect, stage views and messages included)";
  }
  json measured;
  measured["machine_load_average"] = {{"start", load_start}, {"end", load_average()}};
  measured["quick"] = quick;
  measured["method"] =
      "the bench starts oobleck-coordinator and oobleck-worker processes, stamps the coordinator's stdout lines on "
      "arrival and sends SIGKILL / SIGSTOP to a worker half a failure-free step after a commit; detect = fault -> first "
      "failure notice; the decision, copy and downtime come from the coordinator's 'reconfigured' record";
  measured["events"] = json::array();
  for (const auto& r : results) measured["events"].push_back(result_json(r, p2p_gb));
  json summary;
  auto stats = [&](const std::vector<double>& v) {
    json o;
    o["median"] = median(v);
    o["min"] = min_of(v);
    o["max"] = max_of(v);
    o["n"] = v.size();
    return o;
  };
  summary["crash_detect_ms"] = stats(crash_detect);
  summary["crash_loss_notice_ms"] = stats(crash_lost);
  summary["hang_detect_ms_default_1000_10000"] = stats(hang_default);
  summary["hang_detect_ms_200_1500"] = stats(hang_short);
  summary["decision_ms"] = stats(decisions);
  summary["copy_gb_per_s_effective"] = stats(bandwidths);
  summary["copy_fit"]["fixed_ms"] = fit_fixed_ms;
  summary["copy_fit"]["gb_per_s"] = fit_bytes_per_ms / 1e6;
  summary["copy_fit"]["points"] = pts.size();
  if (p2p) {
    summary["host_p2p"]["gb_per_s"] = p2p->first;
    summary["host_p2p"]["bytes"] = p2p->second;
    summary["host_p2p"]["from"] = transport_label;
  }
  summary["copy_path"]["bytes"] = path.bytes;
  summary["copy_path"]["serialize_ms"] = path.serialize_ms;
  summary["copy_path"]["install_ms"] = path.install_ms;
  summary["copy_path"]["memcpy_ms"] = path.memcpy_ms;
  summary["downtime_within_bound"]["met"] = bound_met;
  summary["downtime_within_bound"]["of"] = bound_total;
  summary["spurious_losses"] = spurious;
  measured["summary"] = summary;
  measured["targets"] = targets;
  measured["trace_replay"] = replay_json;
  measured["how_the_costs_were_derived"] = {
      {"detection_ms", "median crash detection (kill -9 -> the coordinator's first failure notice); a hang costs the "
                       "heartbeat timeout instead (summary.hang_detect_ms_*)"},
      {"planning_ms", "median over crashes of (first failure notice -> the resumed step's start) minus the copy's "
                      "marginal time: the decision, epoch messages, mesh connect and stage views"},
      {"copy_bytes_per_s", copy_how}};
  json costs;
  // A figure this run could not measure is left out: the simulator's default then applies.
  if (std::isfinite(detection)) costs["detection_ms"] = detection;
  if (std::isfinite(planning_ms)) costs["planning_ms"] = planning_ms;
  if (std::isfinite(copy_bps) && copy_bps > 0) costs["copy_bytes_per_s"] = copy_bps;
  costs["source"] = std::string("bench/recovery") + (quick ? " --quick" : "") +
                    ": the local cluster (oobleck-coordinator + workers on 127.0.0.1, host transport)";
  costs["measured"] = measured;
  std::cout << "\nrecovery costs for oobleck-sim: detection " << fmt("%.1f", detection) << " ms, planning "
            << fmt("%.1f", planning_ms) << " ms, copy " << fmt("%.3g", copy_bps) << " bytes/s\n";
  // The simulator must read what we write.
  const auto text = costs.dump(2);
  oobleck::sim::parse_recovery_costs(text, "recovery.json");
  if (!json_path.empty()) {
    std::ofstream(json_path) << text << "\n";
    std::cout << "wrote " << json_path << "\n";
  }
  std::cout << "total " << fmt("%.0f", ms_between(bench_started, clock_type::now()) / 1000) << " s, load average "
            << load_average() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
