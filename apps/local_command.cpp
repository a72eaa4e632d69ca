// oobleck-local: a whole job on this machine: one coordinator and N worker processes on 127.0.0.1,
// their progress streamed to stdout. Every process it started is gone when it returns, on every
// path (success, failure, SIGINT/SIGTERM).
//
// What it needs to know about the job (the coordinator's address, the workers that registered, the
// first formed epoch, the last committed step) it learns from the coordinator's --address-file and
// --events-out files, never from its log lines: those are echoed for people and may be reworded.

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "actors/injector.hpp"
#include "apps/cluster_commands.hpp"
#include "apps/cluster_common.hpp"
#include "apps/coordinator_link.hpp"
#include "apps/flags.hpp"
#include "apps/job_file.hpp"
#include "apps/local_events.hpp"
#include "apps/local_options.hpp"
#include "apps/local_processes.hpp"
#include "apps/local_setup.hpp"
#include "apps/program_main.hpp"
#include "apps/progress_bar.hpp"
#include "apps/tls.hpp"
#include "apps/trace_replay.hpp"
#include "messages/event_json.hpp"
#include "messages/input_error.hpp"
#include "runtime/child_process.hpp"

namespace oobleck::apps {

namespace {

std::atomic<int> stop_signal{0};
extern "C" void on_stop_signal(int sig) { stop_signal = sig; }

/// Runs `wait_for` (a wait for something to end); if it has not returned after `after`, says
/// `what` once, so that a stop that hangs names what it waits for instead of going silent (a
/// loaded CI run once hung silently after "training finished", with a replacement coordinator).
void say_if_slow(const std::function<void(const std::string&)>& say, const std::string& what,
                 std::chrono::seconds after, const std::function<void()>& wait_for) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watch([&] {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, after, [&] { return done; })) say(what);
  });
  auto finish = [&] {
    {
      std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_all();
    watch.join();
  };
  try {
    wait_for();
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

/// Carries out one trace event: kill -9 of the removed nodes' workers, then the added nodes'
/// workers started (numbered as the schedule says, which is the order they are started in).
/// Returns the progress line.
template <class Start>
std::string replay_step(const sim::replay_event& e, double local_s, const std::vector<runtime::child_process>& workers,
                        int& next_worker, Start&& start_worker) {
  char at[64];
  std::snprintf(at, sizeof at, "trace %g s (%.2f s here): ", e.ms / 1000, local_s);
  std::string line = at;
  for (std::size_t i = 0; i < e.killed.size(); ++i) {
    const auto& worker = workers.at(static_cast<std::size_t>(e.killed[i]));
    worker.signal(SIGKILL);
    const pid_t pid = worker.pid();
    line += e.removed[i] + " removed: kill -9 of worker node" + std::to_string(e.killed[i]) + " (pid " +
            std::to_string(pid) + "); ";
  }
  for (std::size_t i = 0; i < e.started.size(); ++i) {
    if (e.started[i] != next_worker) throw std::logic_error("trace replay: worker numbers out of order");
    start_worker(next_worker++);
    line += e.added[i] + " added: started worker node" + std::to_string(e.started[i]) + " (it joins); ";
  }
  line.resize(line.size() - 2);
  return line;
}

/// One run of oobleck-local, in its phases. Every early return of a phase is an exit status; the
/// members' order is the order of their ends, reversed: the failure injector first, then every
/// process (before any thread that echoes their output is joined), then the events' reader and the
/// console (the scratch directory, run_local_command's, goes after them all).
class local_run {
 public:
  local_run(const local_options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
            const std::filesystem::path& dir)
      : o_(o),
        s_(prepare_local_run(o, dir)),
        coord_args_(local_coordinator_args(o, s_, args, dir)),
        screen_(out, &out == &std::cout && stdout_wants_bar()),
        err_(err),
        meter_(s_.replay ? 0 : s_.steps, s_.job.training.global_batch),  // a trace's end is not a step count
        tail_(s_.events_path,
              [this](const messages::timed_event& e) {
                progress_.on_event(e);
                if (screen_.has_bar() && e.event.kind == messages::event_kind::step_committed) {
                  meter_.committed(e.event.step, e.event.loss, e.unix_ms);
                  screen_.bar(progress_bar_line(meter_.figures(), terminal_columns()));
                }
              },
              err),
        // Workers on a GPU start as programs: a fork is safe for CUDA only before it is initialised,
        // which no GPU run has checked for LibTorch's loading yet.
        procs_(s_.bin, [this](const std::string& line) { say(line); }, screen_.has_bar(),
               !o.no_fork_server && s_.job.cluster.device == "cpu",
               [this](const std::string& line) { say(local_ + line); }),
        deadline_(std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s)) {}

  int run() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    start_coordinator(0);
    if (auto rc = wait_for_address()) return *rc;
    if (auto rc = start_injector()) return *rc;
    if (auto rc = start_workers()) return *rc;
    if (auto rc = watch()) return *rc;
    return wind_down();
  }

 private:
  void say(const std::string& line) { screen_.line(line); }
  std::ostream& error() {  // an error starts on a line of its own, below the bar
    screen_.end_bar();
    return err_;
  }
  /// Runs `wait_for`, saying `what` if it still waits after 20 s (say_if_slow).
  void say_if_slow(const std::string& what, const std::function<void()>& wait_for) {
    apps::say_if_slow([this](const std::string& line) { say(line); }, local_ + what, std::chrono::seconds(20), wait_for);
  }
  bool past_deadline() const { return std::chrono::steady_clock::now() > deadline_; }
  /// A SIGINT or SIGTERM before the job runs: said, and the exit status a shell gives a program
  /// that the signal ended (the processes started so far are stopped on the way out).
  int stopped_while(const std::string& what) {
    error() << "error: stopped by " << (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << " while " << what << "\n";
    return 128 + stop_signal;
  }

  /// The Nth coordinator (0: the first; the Nth --kill-coordinator-at goes to it). The coordinator's
  /// other faults go to its first incarnation only.
  void start_coordinator(std::size_t incarnation) {
    std::vector<std::string> a = coord_args_;
    if (incarnation > 0)
      for (std::size_t k = 0; k + 1 < a.size(); ++k)
        if (a[k] == "--listen") a[k + 1] = address_;
    if (incarnation < o_.kill_coordinator_at.size()) {
      const auto& [step, after_commit] = o_.kill_coordinator_at[incarnation];
      a.insert(a.end(), {after_commit ? "--partial-commit-at" : "--kill-self-at", std::to_string(step)});
    }
    if (incarnation == 0 && !o_.hang_coordinator_at.empty()) a.insert(a.end(), {"--hang-self-at", o_.hang_coordinator_at});
    procs_.start_coordinator(a);
  }

  std::optional<int> wait_for_address() {
    while (true) {
      if (auto a = read_address(s_.address_file)) {
        address_ = *a;
        return std::nullopt;
      }
      if ((coordinator_status_ = procs_.coordinator().poll())) {
        error() << "error: the coordinator exited with status " << *coordinator_status_ << " before listening\n";
        return *coordinator_status_ == 2 ? 2 : 1;
      }
      if (stop_signal) return stopped_while("waiting for the coordinator to listen");
      if (past_deadline()) {
        error() << "error: the coordinator did not start listening\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  /// The failure injector: an actor of this process, subscribed to the coordinator's events.
  std::optional<int> start_injector() {
    const auto& faults = o_.faults;
    if (faults.empty()) return std::nullopt;
    caf_cfg_ = std::make_unique<cluster_config>();
    // The injector only listens: without heartbeats the coordinator would drop its silent
    // connection after the job's connection timeout, and the injector would miss the losses.
    caf_cfg_->set_heartbeat(s_.job.cluster.heartbeat_interval_ms, s_.job.cluster.connection_timeout_ms);
    use_tls(*caf_cfg_, s_.tls);
    caf_sys_ = std::make_unique<caf::actor_system>(*caf_cfg_);
    const auto at = parse_host_port("coordinator", address_);
    const auto coord = connect_first_coordinator(*caf_sys_, {at}, std::chrono::steady_clock::now() + std::chrono::seconds(10),
                                                 "10 s", [](const std::string&) {});
    actors::injector_deps d{coord, actors::read_token_file(s_.token), faults, progress_printer("injector")};
    // A coordinator restarted below listens at the same address: the injector follows it there and
    // hands it the faults the lost one still held (detached: each attempt blocks up to 1 s).
    d.find_coordinator = [sys = caf_sys_.get(), at] {
      return try_coordinator(*sys, at, std::chrono::milliseconds(1000));
    };
    d.drop_coordinator_link = [at] { return shut_down_connections_to(at); };
    d.relink_wait = coordinator_link_settle;
    d.grace_s = o_.coordinator_grace_s;
    unfired_ = d.unfired;
    const auto handed_over = d.handed_over;
    injector_.actor = caf_sys_->spawn<caf::detached>(actors::injector, d);
    // Workers start once the coordinator holds every fault: each is then delivered to its node
    // on admission, before the node's first epoch, so no step passes before its fault is armed.
    const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (*handed_over < static_cast<int>(faults.size())) {
      if (stop_signal) return stopped_while("handing the injected faults to the coordinator");
      if (std::chrono::steady_clock::now() > by) {
        error() << "error: the coordinator did not take the injected faults within 30 s\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }

  void start_worker(int i) {
    const auto& c = s_.job.cluster;
    // Workers share GPU 0 over the host transport; NCCL takes one GPU per worker: worker i, GPU i.
    const std::string device = c.data_plane == "nccl" ? c.device + ":" + std::to_string(i) : c.device;
    std::vector<std::string> a{"--coordinator", address_, "--token-file", s_.token, "--name",
                               "node" + std::to_string(i), "--slots", std::to_string(c.slots_per_node),
                               "--device", device, "--heartbeat-interval-ms", std::to_string(c.heartbeat_interval_ms),
                               "--connection-timeout-ms", std::to_string(c.connection_timeout_ms),
                               "--coordinator-grace", std::to_string(o_.coordinator_grace_s)};
    a.insert(a.end(), s_.tls_forward.begin(), s_.tls_forward.end());
    procs_.start_worker(a);
  }

  /// The coordinator predicts a step as if every slot computed on a core of its own: on this one
  /// machine, more slots than cores share them, and a user would read the prediction as a promise.
  void say_if_cores_shared() {
    if (s_.job.cluster.device != "cpu") return;
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    const int slots = s_.nodes * s_.job.cluster.slots_per_node;
    if (cores <= 0 || slots <= cores) return;
    say(local_ + std::to_string(slots) + " worker slot(s) share this machine's " + std::to_string(cores) +
        " core(s): steps take longer than the coordinator's predicted step, which gives every slot a core");
  }

  std::optional<int> start_workers() {
    say_if_cores_shared();
    if (s_.replay) say(local_ + s_.replay->summary(o_.trace_path));
    for (int i = 0; i < s_.nodes && !coordinator_status_; ++i) {
      start_worker(i);
      // A trace replay starts its workers one at a time, so that worker i is node i (ids follow
      // registration order): the simulator's node ids are the same (sim::replay_trace), and so
      // are the pipelines a removal hits.
      while (s_.replay && progress_.registered <= i && !(coordinator_status_ = procs_.coordinator().poll())) {
        if (stop_signal) return stopped_while("waiting for worker node" + std::to_string(i) + " to register");
        if (past_deadline()) {
          error() << "error: worker node" << i << " did not register\n";
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    next_worker_ = s_.nodes;
    return std::nullopt;
  }

  /// A coordinator that a signal ended (a crash, kill -9) is started again at the same address; the
  /// replacement adopts the job from the workers, which wait for it (--coordinator-grace).
  bool restart_coordinator() {
    if (!coordinator_status_ || *coordinator_status_ < 128 || trace_stopped_ || stop_signal) return false;
    if (restarts_ >= 10) {
      error() << "error: the coordinator died " << restarts_ << " times; not starting it again\n";
      return false;
    }
    ++restarts_;
    say(local_ + "the coordinator died (status " + std::to_string(*coordinator_status_) +
        "): starting a replacement at " + address_);
    start_coordinator(static_cast<std::size_t>(restarts_));
    coordinator_status_.reset();
    return true;
  }

  void replay_due() {
    const auto now = std::chrono::steady_clock::now();
    auto& replay = *s_.replay;
    if (!replay.begun() && progress_.formed) replay.begin(progress_.formed_at);
    for (const auto& e : replay.due(now))
      say(local_ + replay_step(e, replay.local_s(e), procs_.workers(), next_worker_,
                               [this](int i) { start_worker(i); }));
    if (replay.ended(now)) {
      std::ostringstream line;
      line << local_ << "the trace ended (trace " << replay.schedule().end_ms / 1000 << " s): stopping the job";
      say(line.str());
      procs_.coordinator().signal(SIGTERM);  // an orderly stop: the steps committed so far stand
      trace_stopped_ = true;
    }
  }

  void start_joins() {
    for (auto it = joins_.begin(); it != joins_.end();)
      if (it->first == join_when_waiting ? progress_.waits > 0 : progress_.last_step >= it->first) {
        say(local_ + (it->first == join_when_waiting ? std::string("the job waits for nodes")
                                                      : "step " + std::to_string(it->first) + " committed") +
            ": starting " + std::to_string(it->second) + " more worker(s)");
        for (int k = 0; k < it->second; ++k) start_worker(next_worker_++);
        it = joins_.erase(it);
      } else {
        ++it;
      }
  }

  /// Until the coordinator ends for good: the trace, the joins, the workers that could not start,
  /// a signal, the deadline.
  std::optional<int> watch() {
    while ((!coordinator_status_ && !(coordinator_status_ = procs_.coordinator().poll())) || restart_coordinator()) {
      if (coordinator_status_) continue;
      if (s_.replay && !trace_stopped_) replay_due();
      start_joins();
      // A starting worker that ends before it registered (it could not start, or was refused) will
      // never take part: say so and stop, rather than wait for --timeout. The events read so far may
      // lag (a worker can register and be killed by an injected fault before they are read): the
      // whole file decides.
      auto& workers = procs_.workers();
      for (std::size_t i = 0; i < workers.size() && !progress_.formed; ++i) {
        const std::string name = "node" + std::to_string(i);
        if (workers[i].reaped() || progress_.has_registered(name)) continue;
        if (const auto status = workers[i].poll(); status && !registered_in(s_.events_path, name)) {
          error() << "error: worker node" << i << " exited with status " << *status
                  << " before it registered (its output is above); stopping the job\n";
          procs_.coordinator().signal(SIGTERM);
          procs_.coordinator().wait();
          return 1;
        }
      }
      if (stop_signal) {
        say(local_ + "stopping on " + (stop_signal == SIGINT ? "SIGINT" : "SIGTERM"));
        procs_.coordinator().signal(SIGTERM);  // an orderly stop of the whole job
        stop_signal = 0;
      }
      if (std::chrono::steady_clock::now() > deadline_) {
        error() << "error: the job did not finish within " << o_.timeout_s << " s; stopping every process\n";
        return 1;
      }
      progress_.wait_for_event(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }

  /// The coordinator is gone: every event it wrote is in the file, every line of its output
  /// echoed; the workers leave, the injector counts what did not fire.
  int wind_down() {
    tail_.stop();  // reads the file to its end
    for (const auto& [step, count] : joins_) {
      // The step may have committed just before the coordinator exited, between two looks at the
      // events: the job had ended by the time oobleck-local could start anyone.
      const bool seen = step != join_when_waiting && progress_.last_step >= step;
      say(local_ + "--join-at " + (step == join_when_waiting ? std::string("waiting") : std::to_string(step)) + ":" +
          std::to_string(count) + " started no worker: the job ended " +
          (step == join_when_waiting ? std::string("before it waited for nodes")
           : seen                    ? "right after step " + std::to_string(step) + " committed"
                                     : "before it saw step " + std::to_string(step) + " commit"));
    }
    say_if_slow("still reading the coordinator's output after 20 s", [&] { procs_.join_coordinator_output(); });
    // A worker that never registered (one started by --join-at or a trace near the end) would wait
    // for the coordinator until its own connect timeout: it holds nothing, so it goes now.
    auto& workers = procs_.workers();
    for (std::size_t i = 0; i < workers.size(); ++i)
      if (!workers[i].reaped() && !progress_.has_registered("node" + std::to_string(i))) {
        workers[i].kill_and_reap();
        say(local_ + "worker node" + std::to_string(i) + " had not registered when the job ended: stopped it");
      }
    // The workers leave once the coordinator told them; give them a moment, then make sure.
    const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto running = [&] { return std::any_of(workers.begin(), workers.end(), [](const auto& w) { return !w.reaped(); }); };
    while (running() && std::chrono::steady_clock::now() < grace) {
      for (auto& w : workers)
        if (!w.poll() && w.stopped()) w.kill_and_reap();  // frozen (--hang-at): it cannot leave, do not wait for it
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (*coordinator_status_ == 0 && unfired_) {
      stop_injector();
      if (*unfired_ > 0) {
        error() << "error: " << *unfired_ << " injected fault(s) did not fire; the job ran without them\n";
        return 1;
      }
    }
    return *coordinator_status_;
  }

  /// The injector counts the faults whose node was never lost once the job has stopped: it ends on
  /// the job's stop event. A subscription misses what a coordinator published before it (a
  /// replacement trains on within milliseconds, and a connection to a coordinator that went away
  /// can answer nothing for seconds), and the job may end first: the events file, which every
  /// coordinator of the job wrote, is handed to it whole, in order, ending with the stop.
  void stop_injector() {
    {
      caf::scoped_actor self{*caf_sys_};
      self->monitor(injector_.actor);
      std::ifstream in(s_.events_path);
      for (std::string line; std::getline(in, line);) try {
          if (const auto e = messages::parse_event_line(line)) self->send(injector_.actor, e->event);
        } catch (const messages::input_error&) {  // (the coordinators are gone: every line is whole)
        }
      self->receive([](caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [&] {
        caf::anon_send_exit(injector_.actor, caf::exit_reason::user_shutdown);
      });
    }
    injector_.actor = nullptr;
    say_if_slow("the failure injector has not stopped after 20 s", [&] { caf_sys_.reset(); });  // waits for the injector
  }

  const local_options& o_;
  // oobleck-local's own lines, prefixed as every program's are (OOBLECK_LOG_PREFIX).
  const std::string local_ = [] {
    const char* prefix = std::getenv("OOBLECK_LOG_PREFIX");
    return std::string(prefix ? prefix : "") + "[local] ";
  }();
  local_setup s_;
  const std::vector<std::string> coord_args_;
  // Where the lines go: on a terminal, with a progress bar below them (from the committed steps'
  // events); elsewhere, as they are.
  console screen_;
  std::ostream& err_;
  progress_meter meter_;
  job_progress progress_;  // what the job does, from the coordinator's events as they are written
  event_tail tail_;
  local_processes procs_;
  // The injector looks for a lost coordinator for the grace period: on every way out it is ended
  // first (the actor system's destructor waits for it).
  std::unique_ptr<cluster_config> caf_cfg_;
  std::unique_ptr<caf::actor_system> caf_sys_;
  struct end_injector {
    caf::actor actor;
    ~end_injector() {
      if (actor) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    }
  } injector_;
  std::shared_ptr<std::atomic<int>> unfired_;
  const std::chrono::time_point<std::chrono::steady_clock, std::chrono::duration<double, std::nano>> deadline_;
  std::string address_;
  std::optional<int> coordinator_status_;
  std::vector<std::pair<std::int64_t, int>> joins_ = o_.joins;
  int next_worker_ = 0;
  bool trace_stopped_ = false;
  int restarts_ = 0;
};

}  // namespace

int run_local_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const auto parsed = parse_local_options(args, out);
  if (!parsed) return 0;
  const local_options& o = *parsed;
  if (o.print_default_job) {
    out << default_local_job;
    return 0;
  }
  // The coordinator and the workers end with this process, however it ends (set before any thread
  // of this process starts: setenv is not safe beside other threads' getenv).
  ::setenv(exit_with_parent_variable, std::to_string(::getpid()).c_str(), 1);
  // A scratch directory for the token, the job file, the coordinator's address and its events.
  char dir_template[] = "/tmp/oobleck-local-XXXXXX";
  if (!::mkdtemp(dir_template)) throw std::runtime_error("cannot create a scratch directory in /tmp");
  struct remove_dir {
    std::filesystem::path d;
    ~remove_dir() { std::filesystem::remove_all(d); }
  } cleanup{dir_template};
  return local_run(o, args, out, err, cleanup.d).run();
}

}  // namespace oobleck::apps
