#include "apps/local_processes.hpp"

#include <utility>

namespace oobleck::apps {

local_processes::local_processes(std::filesystem::path bin, say_fn say, bool echo_workers, bool fork_workers,
                                 say_fn note)
    : bin_(std::move(bin)), say_(std::move(say)), fork_workers_(fork_workers), note_(std::move(note)) {
  if (echo_workers) {
    workers_out_.emplace();
    workers_echo_ = std::thread([this] { workers_out_->read_lines(say_); });
  }
}

local_processes::~local_processes() {
  if (coordinator_) coordinator_->kill_and_reap();
  for (auto& w : workers_) w.kill_and_reap();
  fork_server_.reset();
  join_coordinator_output();
  if (workers_out_) workers_out_->close_write_end();
  if (workers_echo_.joinable()) workers_echo_.join();
}

void local_processes::start_coordinator(const std::vector<std::string>& args) {
  auto& pipe = coordinator_out_.emplace_back(std::make_unique<runtime::output_pipe>());
  if (coordinator_) coordinator_->kill_and_reap();
  coordinator_.emplace((bin_ / "oobleck-coordinator").string(), args,
                       runtime::child_streams{.out = runtime::child_output::descriptor(pipe->write_end())});
  pipe->close_write_end();
  coordinator_echo_.emplace_back([p = pipe.get(), this] { p->read_lines(say_); });
}

void local_processes::start_worker(const std::vector<std::string>& args) {
  runtime::child_streams streams;
  if (workers_out_) streams.out = runtime::child_output::descriptor(workers_out_->write_end());
  // A worker computes on one thread (runtime::use_one_compute_thread), but OpenBLAS reads its thread
  // count when it is loaded, before main: without this, it starts a thread for every core but one,
  // and each spins ~0.1 s before it sleeps, on cores the other workers share (bench/RESULTS.md,
  // "Starting a worker"). A value the user set is kept. It also lets the fork server serve: a fork
  // keeps only one thread.
  const std::string path = (bin_ / "oobleck-worker").string();
  const std::vector<std::string> env{"OPENBLAS_NUM_THREADS=1"};
  if (fork_workers_ && !fork_server_) {
    try {
      fork_server_.emplace(path, streams, env);
    } catch (const runtime::child_spawn_error& e) {
      fork_workers_ = false;
      note_(std::string(e.what()) + "; every worker starts as a program of its own");
    }
  }
  if (fork_server_) {
    try {
      workers_.push_back(fork_server_->start(args, streams));
      return;
    } catch (const runtime::child_spawn_error& e) {
      if (fork_server_->gone()) {  // killed, say: the workers from now on start as programs
        fork_server_.reset();
        fork_workers_ = false;
        note_(std::string(e.what()) + "; this worker and every later one start as programs of their own");
      } else {
        note_(std::string(e.what()) + "; worker " + std::to_string(workers_.size()) + " starts as a program of its own");
      }
    }
  }
  workers_.emplace_back(path, args, streams, env);
}

void local_processes::join_coordinator_output() {
  for (auto& t : coordinator_echo_)
    if (t.joinable()) t.join();
}

}  // namespace oobleck::apps
