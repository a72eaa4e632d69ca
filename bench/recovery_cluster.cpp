#include "bench/recovery_cluster.hpp"

#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <stdexcept>

#include "bench/cluster_programs.hpp"

namespace fs = std::filesystem;

namespace oobleck::bench {

local_cluster::local_cluster(const options& o) : o_(o) {
  char tmpl[] = "/tmp/oobleck-bench-recovery-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a scratch directory");
  dir_ = tmpl;
  std::ofstream(dir_ / "job.toml") << o.job_text;
  start(o.bin + "/oobleck-coordinator",
        {"--listen", "127.0.0.1:0", "--config", (dir_ / "job.toml").string(), "--token-file", (dir_ / "token").string(),
         "--nodes", std::to_string(o.nodes), "--steps", std::to_string(o.steps), "--metrics-out", metrics_path()},
        runtime::child_output::descriptor(coordinator_out_.write_end()));
  coordinator_out_.close_write_end();
  reader_ = std::jthread([this] {
    coordinator_out_.read_lines([this](const std::string& text) {
      const auto t = clock_type::now();
      std::lock_guard lock(mu_);
      lines_.push_back({t, text});
      cv_.notify_all();
    });
    std::lock_guard lock(mu_);
    eof_ = true;
    cv_.notify_all();
  });
  const auto at = wait_for([](const std::string& l) { return l.find("listening on 127.0.0.1:") != std::string::npos; },
                           0, 60);
  if (!at) throw std::runtime_error("the coordinator did not start listening:\n" + transcript());
  const std::string l = line(*at).text;
  const auto begin = l.find("127.0.0.1:");
  const std::string address = l.substr(begin, l.find(' ', begin) - begin);
  for (int i = 0; i < o.nodes; ++i)
    start(o.bin + "/oobleck-worker",
          {"--coordinator", address, "--token-file", (dir_ / "token").string(), "--name", "w" + std::to_string(i),
           "--heartbeat-interval-ms", std::to_string(o.heartbeat_ms), "--connection-timeout-ms",
           std::to_string(o.timeout_ms)},
          runtime::child_output::file((dir_ / ("w" + std::to_string(i) + ".log")).string()));
  // Node ids are given in order of admission: map them to our processes.
  std::size_t from = 0;
  for (int joined = 0; joined < o.nodes; ++joined) {
    const auto j = wait_for([](const std::string& s) { return s.find(" joined: w") != std::string::npos; }, from, 60);
    if (!j) throw std::runtime_error("only " + std::to_string(joined) + " worker(s) joined:\n" + transcript());
    const std::string s = line(*j).text;
    const auto at_node = s.find("node ") + 5;
    const int id = std::stoi(s.substr(at_node));
    const int w = std::stoi(s.substr(s.find(" joined: w") + 10));
    node_process_[id] = 1 + static_cast<std::size_t>(w);
    from = *j + 1;
  }
}

local_cluster::~local_cluster() {
  for (auto& p : processes_) p.kill_and_reap();
  reader_.join();
  std::error_code ignored;
  if (!keep_) fs::remove_all(dir_, ignored);
}

runtime::child_process& local_cluster::start(const std::string& program, const std::vector<std::string>& args,
                                             const runtime::child_output& out) {
  return processes_.emplace_back(program, args, runtime::child_streams{.out = out});
}

runtime::child_process& local_cluster::process_of(int node) { return processes_.at(node_process_.at(node)); }

clock_type::time_point local_cluster::signal(int node, int sig) {
  auto& p = process_of(node);
  const auto t = clock_type::now();
  p.signal(sig);
  return t;
}

void local_cluster::kill(int node) { process_of(node).kill_and_reap(); }

std::size_t local_cluster::size() const {
  std::lock_guard lock(mu_);
  return lines_.size();
}

stamped_line local_cluster::line(std::size_t i) const {
  std::lock_guard lock(mu_);
  return lines_.at(i);
}

std::vector<stamped_line> local_cluster::lines() const {
  std::lock_guard lock(mu_);
  return lines_;
}

std::string local_cluster::transcript() const {
  std::string s;
  for (const auto& l : lines()) s += l.text + "\n";
  return s;
}

std::optional<std::size_t> local_cluster::wait_for(const std::function<bool(const std::string&)>& pred,
                                                   std::size_t from, double timeout_s) {
  std::unique_lock lock(mu_);
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(timeout_s));
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

int local_cluster::stop(double timeout_s) {
  processes_.front().signal(SIGTERM);
  return wait_exit(timeout_s);
}

int local_cluster::wait_exit(double timeout_s) {
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(timeout_s));
  return processes_.front().wait_until(deadline).value_or(-1);
}

void local_cluster::read_metrics(std::vector<nlohmann::json>& steps, std::vector<nlohmann::json>& events) const {
  auto m = bench::read_metrics(metrics_path());
  steps = std::move(m.steps);
  events = std::move(m.events);
}

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

}  // namespace oobleck::bench
