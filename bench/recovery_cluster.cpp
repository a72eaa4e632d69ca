#include "bench/recovery_cluster.hpp"

#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

#include "apps/job_file.hpp"
#include "bench/cluster_programs.hpp"
#include "messages/profile_file.hpp"

namespace fs = std::filesystem;

namespace oobleck::bench {

local_cluster::local_cluster(const options& o) : o_(o) {
  char tmpl[] = "/tmp/oobleck-bench-recovery-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a scratch directory");
  dir_ = tmpl;
  std::ofstream(dir_ / "job.toml") << o.job_text;
  // Planned from the job's modelled profile, the one the benchmark's replay of the planner uses
  // (recovery_plan.hpp): without a profile the coordinator measures one at the job's start, and
  // the plan, with whether a loss leaves enough nodes, would depend on this machine (the large
  // job planned 2 pipelines of 3 from a measured one, and its first loss stopped it).
  messages::write_profile_json(apps::modelled_profile(apps::parse_job(o.job_text, "job")),
                               (dir_ / "profile.json").string());
  events_ = std::make_unique<event_log>(dir_ / "events.jsonl");  // watched before the coordinator writes
  start(o.bin + "/oobleck-coordinator",
        {"--listen", "127.0.0.1:0", "--config", (dir_ / "job.toml").string(), "--profile",
         (dir_ / "profile.json").string(), "--token-file", (dir_ / "token").string(),
         "--nodes", std::to_string(o.nodes), "--steps", std::to_string(o.steps), "--metrics-out", metrics_path(),
         "--events-out", events_->path().string(), "--address-file", (dir_ / "address").string()},
        runtime::child_output::file((dir_ / "coordinator.log").string()));
  const auto address = wait_for_file_line(dir_ / "address", 60, [this] { return coordinator_alive(); });
  if (!address) throw std::runtime_error("the coordinator did not start listening:\n" + transcript());
  for (int i = 0; i < o.nodes; ++i)
    start(o.bin + "/oobleck-worker",
          {"--coordinator", *address, "--token-file", (dir_ / "token").string(), "--name", "w" + std::to_string(i),
           "--heartbeat-interval-ms", std::to_string(o.heartbeat_ms), "--connection-timeout-ms",
           std::to_string(o.timeout_ms)},
          runtime::child_output::file((dir_ / ("w" + std::to_string(i) + ".log")).string()));
  // Node ids are given in order of admission: map them to our processes by the workers' names.
  std::size_t from = 0;
  for (int joined = 0; joined < o.nodes; ++joined) {
    const auto j = wait_for(is(event_kind::node_joined), from, 60);
    if (!j) throw std::runtime_error("only " + std::to_string(joined) + " worker(s) joined:\n" + transcript());
    const auto& e = (*events_)[*j].event;
    const std::string& name = e.detail;  // the worker's --name
    if (name.size() < 2 || name[0] != 'w') throw std::runtime_error("a worker this benchmark did not start joined: " + name);
    node_process_[static_cast<int>(e.node)] = 1 + std::stoul(name.substr(1));
    from = *j + 1;
  }
}

local_cluster::~local_cluster() {
  for (auto& p : processes_) p.kill_and_reap();
  std::error_code ignored;
  if (!keep_) fs::remove_all(dir_, ignored);
}

runtime::child_process& local_cluster::start(const std::string& program, const std::vector<std::string>& args,
                                             const runtime::child_output& out) {
  return processes_.emplace_back(program, args, runtime::child_streams{.out = out});
}

bool local_cluster::coordinator_alive() { return !processes_.front().poll().has_value(); }

runtime::child_process& local_cluster::process_of(int node) { return processes_.at(node_process_.at(node)); }

double local_cluster::signal(int node, int sig) {
  auto& p = process_of(node);
  const double t = unix_ms_now();
  p.signal(sig);
  return t;
}

void local_cluster::kill(int node) { process_of(node).kill_and_reap(); }

std::optional<std::size_t> local_cluster::wait_for(const std::function<bool(const timed_event&)>& pred,
                                                   std::size_t from, double timeout_s) {
  return events_->wait_for(pred, from, timeout_s, [this] { return coordinator_alive(); });
}

std::string local_cluster::transcript() const {
  std::ifstream in(dir_ / "coordinator.log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int local_cluster::stop(double timeout_s) {
  processes_.front().signal(SIGTERM);
  return wait_exit(timeout_s);
}

int local_cluster::wait_exit(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  return processes_.front().wait_until(deadline).value_or(-1);
}

void local_cluster::read_metrics(std::vector<nlohmann::json>& steps, std::vector<nlohmann::json>& events) const {
  auto m = bench::read_metrics(metrics_path());
  steps = std::move(m.steps);
  events = std::move(m.events);
}

bool is_failure_notice(const timed_event& e) {
  return e.event.kind == event_kind::node_lost || e.event.kind == event_kind::step_failed;
}

}  // namespace oobleck::bench
