// oobleck-local: a whole job on this machine: one coordinator and N worker processes on 127.0.0.1,
// their progress streamed to stdout. Every process it started is gone when it returns, on every
// path (success, failure, SIGINT/SIGTERM).
//
// What it needs to know about the job (the coordinator's address, the workers that registered, the
// first formed epoch, the last committed step) it learns from the coordinator's --address-file and
// --events-out files, never from its log lines: those are echoed for people and may be reworded.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
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
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "actors/injector.hpp"
#include "apps/cluster_commands.hpp"
#include "apps/checkpoint_job.hpp"
#include "apps/cluster_common.hpp"
#include "apps/flags.hpp"
#include "apps/job_file.hpp"
#include "apps/local_events.hpp"
#include "apps/local_options.hpp"
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

std::filesystem::path own_directory() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

}  // namespace

int run_local_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const auto parsed = parse_local_options(args, out);
  if (!parsed) return 0;
  const local_options& o = *parsed;
  if (o.print_default_job) {
    out << default_local_job;
    return 0;
  }

  // oobleck-local's own lines, prefixed as every program's are (OOBLECK_LOG_PREFIX).
  const std::string local = [] {
    const char* prefix = std::getenv("OOBLECK_LOG_PREFIX");
    return std::string(prefix ? prefix : "") + "[local] ";
  }();

  // A scratch directory for the token, the job file, the coordinator's address and its events.
  char dir_template[] = "/tmp/oobleck-local-XXXXXX";
  if (!::mkdtemp(dir_template)) throw std::runtime_error("cannot create a scratch directory in /tmp");
  const std::filesystem::path dir = dir_template;
  struct remove_dir {
    std::filesystem::path d;
    ~remove_dir() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  std::string job_path = o.config;
  if (o.config.empty()) {
    job_path = (dir / "job.toml").string();
    std::ofstream(job_path) << default_local_job;
  }
  if (!o.device.empty()) {
    // --device: the job's text with cluster.device set (its relative paths made absolute), in the
    // scratch directory; the coordinator runs that job.
    const std::string on_device = (dir / "job-on-device.toml").string();
    std::ofstream(on_device) << job_text_on_device(read_job_text(job_path), job_path, o.device);
    job_path = on_device;
  }
  const job_file job = read_job_file(job_path);  // a bad job file is refused here, before any process starts
  check_device_built(job);
  // TLS: checked here, then handed on as flags (files made absolute; a passphrase through a file of
  // the scratch directory, which only this user can read).
  const tls_section tls = resolve_tls(job.tls, o.tls);
  const std::string passphrase_file = (dir / "tls-passphrase").string();
  if (!tls.passphrase.empty()) {
    std::ofstream(passphrase_file) << tls.passphrase << "\n";
    std::filesystem::permissions(passphrase_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  const std::vector<std::string> tls_forward = tls_args(tls, passphrase_file);
  const auto& faults = o.faults;
  auto joins = o.joins;
  std::unique_ptr<trace_replayer> replay;
  if (!o.trace_path.empty())
    replay = std::make_unique<trace_replayer>(o.trace_path, o.trace_nodes.value_or(o.nodes.value_or(job.cluster.nodes)),
                                              o.time_scale);
  // With a trace, its starting nodes are the workers, and the trace's end (not a step count)
  // ends the run unless --steps says otherwise.
  const int nodes = replay ? static_cast<int>(replay->schedule().initial.size()) : o.nodes.value_or(job.cluster.nodes);
  const std::int64_t steps = o.steps.value_or(replay ? std::int64_t{1} << 40
                                                        : static_cast<std::int64_t>(job.training.steps));
  const int fault_tolerance = o.fault_tolerance.value_or(job.cluster.fault_tolerance);
  for (const auto& f : faults)
    if (f.node >= nodes)
      throw messages::input_error("node " + std::to_string(f.node) + " does not exist: the job's nodes are 0.." +
                                  std::to_string(nodes - 1));
  if (!o.metrics_out.empty()) std::ofstream(o.metrics_out, std::ios::trunc);  // fresh file per run
  // The events file: the user's (fresh per run, like the metrics) or one of the scratch directory.
  const std::string events_path =
      o.events_out.empty() ? (dir / "events.jsonl").string() : std::filesystem::absolute(o.events_out).string();
  if (!std::ofstream(events_path, std::ios::trunc))
    throw messages::input_error("--events-out: cannot write " + events_path);
  const auto address_file = dir / "coordinator.address";
  const std::string token = (dir / "token").string();
  const auto bin = own_directory();

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  // Where the lines go: on a terminal, with a progress bar below them (from the committed steps'
  // events); elsewhere, as they are.
  console screen(out, &out == &std::cout && stdout_wants_bar());
  auto say = [&screen](const std::string& line) { screen.line(line); };
  auto error = [&screen, &err]() -> std::ostream& {  // an error starts on a line of its own, below the bar
    screen.end_bar();
    return err;
  };
  progress_meter meter(replay ? 0 : steps, job.training.global_batch);  // a trace's end is not a step count
  // What the job does, from the coordinator's events as they are written.
  job_progress progress;
  event_tail tail(
      events_path,
      [&](const messages::timed_event& e) {
        progress.on_event(e);
        if (screen.has_bar() && e.event.kind == messages::event_kind::step_committed) {
          meter.committed(e.event.step, e.event.loss, e.unix_ms);
          screen.bar(progress_bar_line(meter.figures(), terminal_columns()));
        }
      },
      err);

  runtime::output_pipe coordinator_out;
  std::vector<std::string> coord_args{"--listen", "127.0.0.1:0", "--config", job_path, "--token-file", token,
                                      "--nodes", std::to_string(nodes), "--steps", std::to_string(steps),
                                      "--fault-tolerance", std::to_string(fault_tolerance),
                                      "--events-out", events_path, "--address-file", address_file.string()};
  if (!o.metrics_out.empty()) {
    coord_args.push_back("--metrics-out");
    coord_args.push_back(o.metrics_out);
  }
  // Checkpoints: paths made absolute (the coordinator and workers share this filesystem); a stop
  // by the policy prints this program's own command to resume.
  if (!o.checkpoint_dir.empty())
    coord_args.insert(coord_args.end(), {"--checkpoint-dir", std::filesystem::absolute(o.checkpoint_dir).string()});
  if (o.checkpoint_every) coord_args.insert(coord_args.end(), {"--checkpoint-every", std::to_string(*o.checkpoint_every)});
  if (!o.resume.empty()) coord_args.insert(coord_args.end(), {"--resume", std::filesystem::absolute(o.resume).string()});
  coord_args.insert(coord_args.end(), {"--resume-command", local_resume_prefix(args)});
  coord_args.insert(coord_args.end(), {"--coordinator-grace", std::to_string(o.coordinator_grace_s)});
  if (o.digest_every) coord_args.insert(coord_args.end(), {"--digest-every", std::to_string(*o.digest_every)});
  if (!o.profile.empty())
    coord_args.insert(coord_args.end(), {"--profile", std::filesystem::absolute(o.profile).string()});
  else if (job.profile.file.empty() && job.profile.cache.empty() && o.checkpoint_dir.empty() && job.checkpoint.dir.empty())
    // A profile measured at the job's start is kept for the run's replacement coordinators (this
    // program restarts a coordinator that dies), which would otherwise plan from the modelled one.
    coord_args.insert(coord_args.end(), {"--profile-cache", dir.string()});
  // Below the minimum: a trace replay always waits for its nodes to come back (as the simulator's
  // Oobleck does); otherwise as the flags say (the coordinator waits when it has a checkpoint directory).
  if (o.exit_below_minimum) coord_args.push_back("--exit-below-minimum");
  else if (o.wait_for_nodes_s || replay)
    coord_args.insert(coord_args.end(), {"--wait-for-nodes", std::to_string(o.wait_for_nodes_s.value_or(0))});
  coord_args.insert(coord_args.end(), tls_forward.begin(), tls_forward.end());
  // The coordinator's own faults go to its first incarnation only.
  std::vector<std::string> first_args = coord_args;
  // The Nth --kill-coordinator-at goes to the Nth coordinator.
  auto add_kill = [&o](std::vector<std::string>& to, std::size_t incarnation) {
    if (incarnation >= o.kill_coordinator_at.size()) return;
    const auto& [step, after_commit] = o.kill_coordinator_at[incarnation];
    to.insert(to.end(), {after_commit ? "--partial-commit-at" : "--kill-self-at", std::to_string(step)});
  };
  add_kill(first_args, 0);
  if (!o.hang_coordinator_at.empty()) first_args.insert(first_args.end(), {"--hang-self-at", o.hang_coordinator_at});
  runtime::child_process coordinator((bin / "oobleck-coordinator").string(), first_args,
                                     {.out = runtime::child_output::descriptor(coordinator_out.write_end())});
  // With a bar, the workers' lines come through the console too (else they would land on the bar):
  // one pipe for them all, read until the last of them is gone.
  std::optional<runtime::output_pipe> workers_out;
  std::thread workers_echo;
  if (screen.has_bar()) {
    workers_out.emplace();
    workers_echo = std::thread([&workers_out, &say] { workers_out->read_lines(say); });
  }
  struct join_workers_echo {  // after the workers are gone (it is declared before join_echo)
    std::optional<runtime::output_pipe>& pipe;
    std::thread& t;
    ~join_workers_echo() {
      if (pipe) pipe->close_write_end();
      if (t.joinable()) t.join();
    }
  } workers_joiner{workers_out, workers_echo};
  std::vector<runtime::child_process> workers;  // by worker number (its name is "node" + number)

  coordinator_out.close_write_end();  // (a replacement gets a pipe of its own, echoed by its own thread)
  // Echo the coordinator's lines, for people.
  std::thread echo([&coordinator_out, &say] { coordinator_out.read_lines(say); });
  // On every way out: the echo thread reads until the coordinator's end of the pipe closes, so the
  // processes go first (an early return, e.g. --timeout, would otherwise wait for ever).
  struct join_echo {
    std::thread& t;
    runtime::child_process& coordinator;
    std::vector<runtime::child_process>& workers;
    ~join_echo() {
      coordinator.kill_and_reap();
      for (auto& w : workers) w.kill_and_reap();
      if (t.joinable()) t.join();
    }
  } joiner{echo, coordinator, workers};

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
  std::optional<int> coordinator_status;
  std::string address;
  while (address.empty()) {
    if (auto a = read_address(address_file)) {
      address = *a;
      break;
    }
    if ((coordinator_status = coordinator.poll())) {
      error() << "error: the coordinator exited with status " << *coordinator_status << " before listening\n";
      return *coordinator_status == 2 ? 2 : 1;
    }
    if (std::chrono::steady_clock::now() > deadline || stop_signal) {
      error() << "error: the coordinator did not start listening\n";
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The failure injector: an actor of this process, subscribed to the coordinator's events.
  std::unique_ptr<cluster_config> caf_cfg;
  std::unique_ptr<caf::actor_system> caf_sys;
  std::shared_ptr<std::atomic<int>> unfired;
  // The injector looks for a lost coordinator for the grace period: on every way out it is ended
  // first (the actor system's destructor waits for it).
  struct end_injector {
    caf::actor injector;
    ~end_injector() {
      if (injector) caf::anon_send_exit(injector, caf::exit_reason::user_shutdown);
    }
  } injector_stop;
  if (!faults.empty()) {
    caf_cfg = std::make_unique<cluster_config>();
    // The injector only listens: without heartbeats the coordinator would drop its silent
    // connection after the job's connection timeout, and the injector would miss the losses.
    caf_cfg->set_heartbeat(job.cluster.heartbeat_interval_ms, job.cluster.connection_timeout_ms);
    use_tls(*caf_cfg, tls);
    caf_sys = std::make_unique<caf::actor_system>(*caf_cfg);
    const auto coord = connect_coordinator(*caf_sys, parse_host_port("coordinator", address), 10,
                                           [](const std::string&) {});
    actors::injector_deps d{coord, actors::read_token_file(token), faults, progress_printer("injector")};
    // A coordinator restarted below listens at the same address: the injector follows it there and
    // hands it the faults the lost one still held (detached: each attempt blocks up to 1 s).
    d.find_coordinator = [sys = caf_sys.get(), at = parse_host_port("coordinator", address)] {
      return try_coordinator(*sys, at, std::chrono::milliseconds(1000));
    };
    d.grace_s = o.coordinator_grace_s;
    unfired = d.unfired;
    const auto handed_over = d.handed_over;
    injector_stop.injector = caf_sys->spawn<caf::detached>(actors::injector, d);
    // Workers start once the coordinator holds every fault: each is then delivered to its node
    // on admission, before the node's first epoch, so no step passes before its fault is armed.
    const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (*handed_over < static_cast<int>(faults.size())) {
      if (std::chrono::steady_clock::now() > by || stop_signal) {
        error() << "error: the coordinator did not take the injected faults within 30 s\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  auto start_worker = [&](int i) {
    std::vector<std::string> worker_args{"--coordinator", address, "--token-file", token, "--name",
                                         "node" + std::to_string(i), "--slots",
                                         std::to_string(job.cluster.slots_per_node), "--device", job.cluster.device,
                                         "--heartbeat-interval-ms",
                                         std::to_string(job.cluster.heartbeat_interval_ms),
                                         "--connection-timeout-ms",
                                         std::to_string(job.cluster.connection_timeout_ms), "--coordinator-grace",
                                         std::to_string(o.coordinator_grace_s)};
    worker_args.insert(worker_args.end(), tls_forward.begin(), tls_forward.end());
    runtime::child_streams streams;
    if (workers_out) streams.out = runtime::child_output::descriptor(workers_out->write_end());
    workers.emplace_back((bin / "oobleck-worker").string(), worker_args, streams);
  };
  if (replay) say(local + replay->summary(o.trace_path));
  for (int i = 0; i < nodes && !coordinator_status; ++i) {
    start_worker(i);
    // A trace replay starts its workers one at a time, so that worker i is node i (ids follow
    // registration order): the simulator's node ids are the same (sim::replay_trace), and so
    // are the pipelines a removal hits.
    while (replay && progress.registered <= i && !(coordinator_status = coordinator.poll())) {
      if (std::chrono::steady_clock::now() > deadline || stop_signal) {
        error() << "error: worker node" << i << " did not register\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  int next_worker = nodes;
  bool trace_stopped = false;
  // Supervision: a coordinator that a signal ended (a crash, kill -9) is started again at the same
  // address; the replacement adopts the job from the workers, which wait for it (--coordinator-grace).
  std::vector<std::unique_ptr<runtime::output_pipe>> replacement_out;
  std::vector<std::thread> replacement_echo;
  struct join_replacement_echo {
    std::vector<std::thread>& threads;
    ~join_replacement_echo() {
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } replacement_joiner{replacement_echo};
  int restarts = 0;
  auto supervise = [&]() -> bool {
    if (!coordinator_status || *coordinator_status < 128 || trace_stopped || stop_signal) return false;
    if (restarts >= 10) {
      error() << "error: the coordinator died " << restarts << " times; not starting it again\n";
      return false;
    }
    ++restarts;
    say(local + "the coordinator died (status " + std::to_string(*coordinator_status) +
        "): starting a replacement at " + address);
    std::vector<std::string> again = coord_args;
    for (std::size_t k = 0; k + 1 < again.size(); ++k)
      if (again[k] == "--listen") again[k + 1] = address;
    add_kill(again, static_cast<std::size_t>(restarts));
    auto& pipe = replacement_out.emplace_back(std::make_unique<runtime::output_pipe>());
    coordinator.kill_and_reap();
    coordinator = runtime::child_process((bin / "oobleck-coordinator").string(), again,
                                         {.out = runtime::child_output::descriptor(pipe->write_end())});
    pipe->close_write_end();
    replacement_echo.emplace_back([p = pipe.get(), &say] { p->read_lines(say); });
    coordinator_status.reset();
    return true;
  };
  while ((!coordinator_status && !(coordinator_status = coordinator.poll())) || supervise()) {
    if (coordinator_status) continue;
    if (replay && !trace_stopped) {
      const auto now = std::chrono::steady_clock::now();
      if (!replay->begun() && progress.formed) replay->begin(progress.formed_at);
      for (const auto& e : replay->due(now))
        say(local + replay_step(e, replay->local_s(e), workers, next_worker, start_worker));
      if (replay->ended(now)) {
        std::ostringstream line;
        line << local << "the trace ended (trace " << replay->schedule().end_ms / 1000 << " s): stopping the job";
        say(line.str());
        coordinator.signal(SIGTERM);  // an orderly stop: the steps committed so far stand
        trace_stopped = true;
      }
    }
    for (auto it = joins.begin(); it != joins.end();)
      if (it->first == join_when_waiting ? progress.waits > 0 : progress.last_step >= it->first) {
        say(local + (it->first == join_when_waiting ? std::string("the job waits for nodes")
                                                     : "step " + std::to_string(it->first) + " committed") +
            ": starting " + std::to_string(it->second) + " more worker(s)");
        for (int k = 0; k < it->second; ++k) start_worker(next_worker++);
        it = joins.erase(it);
      } else {
        ++it;
      }
    // A starting worker that ends before it registered (it could not start, or was refused) will
    // never take part: say so and stop, rather than wait for --timeout. The events read so far may
    // lag (a worker can register and be killed by an injected fault before they are read): the
    // whole file decides.
    for (std::size_t i = 0; i < workers.size() && !progress.formed; ++i) {
      const std::string name = "node" + std::to_string(i);
      if (workers[i].reaped() || progress.has_registered(name)) continue;
      if (const auto status = workers[i].poll(); status && !registered_in(events_path, name)) {
        error() << "error: worker node" << i << " exited with status " << *status
            << " before it registered (its output is above); stopping the job\n";
        coordinator.signal(SIGTERM);
        coordinator.wait();
        return 1;
      }
    }
    if (stop_signal) {
      say(local + "stopping on " + (stop_signal == SIGINT ? "SIGINT" : "SIGTERM"));
      coordinator.signal(SIGTERM);  // an orderly stop of the whole job
      stop_signal = 0;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      error() << "error: the job did not finish within " << o.timeout_s << " s; stopping every process\n";
      return 1;
    }
    progress.wait_for_event(std::chrono::milliseconds(50));
  }
  // The coordinator is gone: every event it wrote is in the file (read to its end now), and its
  // pipe is at its end (every line echoed).
  tail.stop();
  for (const auto& [step, count] : joins) {
    // The step may have committed just before the coordinator exited, between two looks at the
    // events: the job had ended by the time oobleck-local could start anyone.
    const bool seen = step != join_when_waiting && progress.last_step >= step;
    say(local + "--join-at " + (step == join_when_waiting ? std::string("waiting") : std::to_string(step)) + ":" +
        std::to_string(count) + " started no worker: the job ended " +
        (step == join_when_waiting ? std::string("before it waited for nodes")
         : seen                    ? "right after step " + std::to_string(step) + " committed"
                                   : "before it saw step " + std::to_string(step) + " commit"));
  }
  say_if_slow(say, local + "still reading the first coordinator's output after 20 s", std::chrono::seconds(20),
              [&] { echo.join(); });
  // A worker that never registered (one started by --join-at or a trace near the end) would wait
  // for the coordinator until its own connect timeout: it holds nothing, so it goes now.
  for (std::size_t i = 0; i < workers.size(); ++i)
    if (!workers[i].reaped() && !progress.has_registered("node" + std::to_string(i))) {
      workers[i].kill_and_reap();
      say(local + "worker node" + std::to_string(i) + " had not registered when the job ended: stopped it");
    }
  // The workers leave once the coordinator told them; give them a moment, then make sure.
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto running = [&] { return std::any_of(workers.begin(), workers.end(), [](const auto& w) { return !w.reaped(); }); };
  while (running() && std::chrono::steady_clock::now() < grace) {
    for (auto& w : workers)
      if (!w.poll() && w.stopped()) w.kill_and_reap();  // frozen (--hang-at): it cannot leave, do not wait for it
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (*coordinator_status == 0 && unfired) {
    // The injector counts the faults whose node was never lost once the job has stopped: it ends
    // on the job's stop event. A subscription misses what a coordinator published before it (a
    // replacement trains on within milliseconds, and a connection to a coordinator that went away
    // can answer nothing for seconds), and the job may end first: the events file, which every
    // coordinator of the job wrote, is handed to it whole, in order, ending with the stop.
    {
      caf::scoped_actor self{*caf_sys};
      self->monitor(injector_stop.injector);
      std::ifstream in(events_path);
      for (std::string line; std::getline(in, line);) try {
          if (const auto e = messages::parse_event_line(line)) self->send(injector_stop.injector, e->event);
        } catch (const messages::input_error&) {  // (the coordinators are gone: every line is whole)
        }
      self->receive([](caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [&] {
        caf::anon_send_exit(injector_stop.injector, caf::exit_reason::user_shutdown);
      });
    }
    injector_stop.injector = nullptr;
    say_if_slow(say, local + "the failure injector has not stopped after 20 s", std::chrono::seconds(20),
                [&] { caf_sys.reset(); });  // waits for the injector
    if (*unfired > 0) {
      error() << "error: " << *unfired << " injected fault(s) did not fire; the job ran without them\n";
      return 1;
    }
  }
  return *coordinator_status;
}

}  // namespace oobleck::apps
