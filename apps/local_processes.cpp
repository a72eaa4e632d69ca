#include "apps/local_processes.hpp"

#include <utility>

namespace oobleck::apps {

local_processes::local_processes(std::filesystem::path bin, say_fn say, bool echo_workers)
    : bin_(std::move(bin)), say_(std::move(say)) {
  if (echo_workers) {
    workers_out_.emplace();
    workers_echo_ = std::thread([this] { workers_out_->read_lines(say_); });
  }
}

local_processes::~local_processes() {
  if (coordinator_) coordinator_->kill_and_reap();
  for (auto& w : workers_) w.kill_and_reap();
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
  // "Starting a worker"). A value the user set is kept.
  workers_.emplace_back((bin_ / "oobleck-worker").string(), args, streams,
                        std::vector<std::string>{"OPENBLAS_NUM_THREADS=1"});
}

void local_processes::join_coordinator_output() {
  for (auto& t : coordinator_echo_)
    if (t.joinable()) t.join();
}

}  // namespace oobleck::apps
