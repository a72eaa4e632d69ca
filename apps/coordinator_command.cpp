#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <caf/io/middleman.hpp>
#include <nlohmann/json.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "actors/coordinator.hpp"
#include "actors/monitor.hpp"
#include "apps/cluster_commands.hpp"
#include "apps/checkpoint_job.hpp"
#include "apps/cluster_common.hpp"
#include "apps/coordinator_metrics.hpp"
#include "apps/coordinator_options.hpp"
#include "apps/coordinator_profile.hpp"
#include "apps/flags.hpp"
#include "apps/http_status.hpp"
#include "apps/job_file.hpp"
#include "apps/run_history.hpp"
#include "apps/tls.hpp"
#include "messages/event_json.hpp"
#include "messages/input_error.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/device_spec.hpp"
#include "runtime/nccl_id.hpp"

namespace oobleck::apps {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw messages::input_error(path + ": cannot open the job file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Turns SIGINT and SIGTERM into an orderly shutdown of the coordinator (which tells every worker):
/// the first writes a checkpoint first when the job has a checkpoint folder, a second stops at once.
/// The signals are blocked in every thread (set before the actor system starts its threads) and
/// taken by sigwait on a thread of their own.
class signal_shutdown {
 public:
  signal_shutdown() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // our own wake-up at exit
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  void start(caf::actor_system& sys, messages::coordinator_actor coord, std::string token,
             std::function<void(const std::string&)> log) {
    // The first signal writes a checkpoint first (when the job has a checkpoint folder); a second
    // one stops at once.
    thread_ = std::thread([this, &sys, coord, token, log] {
      for (int received = 0;; ++received) {
        int sig = 0;
        sigwait(&set_, &sig);
        if (sig == SIGUSR1) return;
        const bool checkpoint = received == 0;
        log(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
            (checkpoint ? ", shutting down after a checkpoint (send it again to stop at once)" : ", shutting down now"));
        try {
          caf::scoped_actor self{sys};
          self->request(coord, std::chrono::seconds(10), messages::shutdown_atom_v,
                        std::string("the coordinator was stopped"), checkpoint, operator_proof(sys, coord, token))
              .receive([](std::string&) {}, [](caf::error&) {});
        } catch (...) {
          actors::stop_coordinator(sys, coord);
        }
      }
    });
  }
  ~signal_shutdown() { stop(); }
  /// Ends the signal thread (before the actor system it uses goes away).
  void stop() {
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGUSR1);
      thread_.join();
    }
  }

 private:
  sigset_t set_;
  std::thread thread_;
};

/// The coordinator's own faults, from the hidden flags --kill-self-at, --hang-self-at and
/// --partial-commit-at (oobleck-local's --kill-coordinator-at and --hang-coordinator-at, the tests).
void inject_coordinator_faults(actors::coordinator_deps& deps, const coordinator_options& o,
                               const std::function<void(const std::string&)>& log) {
  std::optional<std::pair<std::uint64_t, double>> hang;
  if (!o.hang_self_at.empty()) hang = parse_step_seconds("--hang-self-at", o.hang_self_at);
  if (o.kill_self_at) {
    // When the first pipeline of step K reports it done: the step's orders are out, its stages
    // compute, and its commit is not decided, however late this process is scheduled.
    deps.on_first_pipeline_done = [kill_at = *o.kill_self_at, log](std::uint64_t step) {
      if (static_cast<std::int64_t>(step) != kill_at) return;
      log("injected fault: the coordinator kills itself (SIGKILL) in the middle of step " + std::to_string(step));
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    };
  }
  if (hang) {
    // Once: a step that runs again after the freeze must not freeze it again.
    deps.on_step_sent = [hang, log](std::uint64_t step) mutable {
      if (!hang || hang->first != step) return;
      log("injected fault: the coordinator freezes for " + std::to_string(hang->second) + " s in the middle of step " +
          std::to_string(step));
      messages::inject_fault f;
      f.kind = messages::fault_kind::hang;
      f.seconds = hang->second;
      hang.reset();
      actors::signal_own_process(f);
    };
  }
  if (o.partial_commit_at) {
    deps.partial_commit_at = static_cast<std::uint64_t>(*o.partial_commit_at);
    deps.die = [] {
      // Long enough for the one commit_step to leave this process.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    };
  }
}

/// What the job's records feed: the dashboard's history, and whether the reconfiguration policy
/// stopped the job (set when it does).
struct job_records {
  std::shared_ptr<run_history> history;
  std::shared_ptr<std::atomic<bool>> stopped_by_policy;
};

/// Points deps' record callbacks at --metrics-out and --events-out (when given; a file that cannot
/// be written is bad input) and at the dashboard's history.
job_records install_records(actors::coordinator_deps& deps, const coordinator_options& o, const job_file& job) {
  auto stopped_by_policy = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::ofstream> metrics;
  if (!o.metrics_out.empty()) {
    metrics = std::make_shared<std::ofstream>(o.metrics_out, std::ios::app);
    if (!*metrics) throw messages::input_error("--metrics-out: cannot write " + o.metrics_out);
    write_metrics_records(deps, metrics);
  }
  if (!o.events_out.empty()) {
    auto events = std::make_shared<std::ofstream>(o.events_out, std::ios::app);
    if (!*events) throw messages::input_error("--events-out: cannot write " + o.events_out);
    deps.on_event = [events](const messages::job_event& e) {
      *events << messages::event_json({e, messages::unix_ms_now()}).dump() << std::endl;
    };
  }
  deps.checkpoint.on_stop = [metrics, stopped_by_policy](const actors::checkpoint_stop_record& r) {
    *stopped_by_policy = true;
    if (metrics) *metrics << checkpoint_stop_json(r) << std::endl;
  };
  // The dashboard's history (GET /history), beside whatever --metrics-out does with the same records.
  auto history = std::make_shared<run_history>();
  deps.on_step = [history, next = std::move(deps.on_step)](const actors::step_record& r) {
    history->add_step({r.step, r.epoch, r.loss, r.wall_ms > 0 ? 1000.0 * static_cast<double>(r.samples) / r.wall_ms : 0,
                       r.wall_ms, messages::unix_ms_now()});
    next(r);
  };
  deps.on_reconfigured = [history, next = std::move(deps.on_reconfigured)](const actors::reconfiguration_record& r) {
    history->add_reconfiguration({r.resumed_step, r.epoch, r.action, planning::numbers(r.lost),
                                  planning::numbers(r.joined), r.downtime_ms, messages::unix_ms_now()});
    next(r);
  };
  // Evaluation rounds ([eval]): a metrics record each, and the dashboard's eval-loss curve.
  deps.eval_every = job.eval.every;
  deps.eval_windows = static_cast<std::int32_t>(job.eval.windows);
  deps.on_eval = [history, metrics](const actors::eval_record& r) {
    history->add_eval({r.step, r.loss, r.windows, messages::unix_ms_now()});
    if (metrics) *metrics << eval_json(r) << std::endl;
  };
  return {history, stopped_by_policy};
}

}  // namespace

int run_coordinator_command(const std::vector<std::string>& args, std::ostream& out, std::ostream&) {
  CLI::App app{"oobleck-coordinator: the job's coordinator. Workers register with it (proving the\n"
               "job token), it plans and drives the training, and operators query it (oobleck-ctl).",
               "oobleck-coordinator"};
  coordinator_options o;
  add_coordinator_flags(app, o);
  if (!parse_flags(app, args, out)) return 0;

  const host_port at = parse_host_port("--listen", o.listen, true);
  const std::string job_text = read_text(o.config);
  const job_file job = read_job_file(o.config);  // refuse a bad job file before anything listens
  const tls_section tls = resolve_tls(job.tls, o.tls);
  // The coordinator needs no GPU, but it draws each epoch's NCCL id, which needs NCCL.
  if (job.cluster.data_plane == "nccl" && !runtime::built_with_cuda())
    throw messages::input_error("cluster.data_plane \"nccl\": the coordinator draws every epoch's NCCL id: " +
                                runtime::no_cuda_build_reason());
  const int nodes = o.nodes.value_or(job.cluster.nodes);
  const int fault_tolerance = o.fault_tolerance.value_or(job.cluster.fault_tolerance);
  const std::int64_t steps = o.steps.value_or(static_cast<std::int64_t>(job.training.steps));
  auto log = progress_printer("coordinator");
  std::string token;
  if (std::ifstream(o.token_file).good()) {
    token = actors::read_token_file(o.token_file);
  } else {
    token = actors::create_token_file(o.token_file);
    log("created the token file " + o.token_file + " (mode 0600): give it to every worker");
  }

  signal_shutdown signals;  // before the actor system's threads exist
  cluster_config cfg;
  cfg.set_heartbeat(job.cluster.heartbeat_interval_ms, job.cluster.connection_timeout_ms);
  use_tls(cfg, tls);
  caf::actor_system sys{cfg};
  // The status endpoint listens before the coordinator does: an address in use stops the start.
  // (Declared after the actor system, so that it stops before the system it asks goes away.)
  std::unique_ptr<http_status_server> http_server;
  host_port http_at{at.host, static_cast<std::uint16_t>(job.http.port)};
  if (!o.http.empty()) http_at = parse_host_port("--http", o.http, true);
  if (!o.http.empty() || job.http.port != 0) {
    try {
      http_server = std::make_unique<http_status_server>(http_at.host, http_at.port);
    } catch (const messages::input_error& e) {
      throw messages::input_error((o.http.empty() ? "http.port: " : "--http: ") + std::string(e.what()));
    }
  }
  actors::coordinator_deps deps;
  deps.policy = {token, actors::sha256_hex(job_text), messages::protocol_version, job.cluster.slots_per_node,
                 job.cluster.device, job.cluster.data_plane == "nccl"};
  deps.job_toml = job_text_for_workers(job_text, o.config);  // relative data paths resolved for every worker
  deps.expected_nodes = nodes;
  deps.log = log;
  deps.job = planner_job(job, nodes, fault_tolerance);
  deps.steps = static_cast<std::uint64_t>(steps);
  deps.faults.evict_after_errors = job.faults.evict_after;
  deps.faults.evict_after_stalls = job.faults.evict_after_stalls;
  deps.faults.step_deadline_min_ms = job.faults.step_deadline_min_ms;
  deps.faults.step_deadline_factor = job.faults.step_deadline_factor;
  deps.faults.first_step_deadline_ms = job.faults.first_step_deadline_ms;
  deps.faults.form_deadline_ms = job.faults.form_deadline_ms;
  deps.faults.digest_every = o.digest_every ? static_cast<std::uint64_t>(*o.digest_every) : job.faults.digest_every;
  deps.clip_norm = job.optimizer.clip_norm;
  deps.run_ahead = true;  // the next step's orders go out with each commit (coordinator_deps::run_ahead)
  if (job.cluster.data_plane == "nccl") deps.new_nccl_id = runtime::new_nccl_unique_id;
  const std::string root = !o.checkpoint_dir.empty() ? o.checkpoint_dir : job.checkpoint.dir;
  // Refused now (checkpoint_error is bad input), not at the first checkpoint hours into the job,
  // which would go on without one, saying so at every attempt.
  if (!root.empty())
    runtime::ensure_checkpoint_root(root,
                                    (!o.checkpoint_dir.empty() ? "--checkpoint-dir " : "[checkpoint] dir ") + root);
  choose_profile(deps, job, o.profile_file,
                 !o.profile_cache.empty() ? o.profile_cache : !job.profile.cache.empty() ? job.profile.cache : root, log);
  const auto every = static_cast<std::uint64_t>(o.checkpoint_every.value_or(static_cast<std::int64_t>(job.checkpoint.every)));
  if (every > 0 && root.empty())
    throw messages::input_error("--checkpoint-every: needs a checkpoint directory (--checkpoint-dir or [checkpoint] dir)");
  deps.checkpoint = checkpoint_deps_for(job, root, every);
  if (!o.resume.empty()) {
    if (const auto chosen = resume_from(deps.checkpoint, job, o.resume); !chosen.empty()) log(chosen);
    if (deps.checkpoint.resume_step >= deps.steps)
      throw messages::input_error("--resume: the checkpoint is at step " + std::to_string(deps.checkpoint.resume_step) +
                                  ": nothing is left of the job's " + std::to_string(steps) + " step(s)");
    log("resuming from " + deps.checkpoint.resume_dir + ": training starts at step " +
        std::to_string(deps.checkpoint.resume_step));
  }
  deps.checkpoint.resume_command = [prefix = o.resume_command, args](const std::string& dir) {
    return prefix.empty() ? resume_command_line("oobleck-coordinator", args, dir) : resume_command_line(prefix, {}, dir);
  };
  if (o.exit_below_minimum && o.wait_for_nodes)
    throw messages::input_error("--wait-for-nodes and --exit-below-minimum: choose one (wait for nodes, or exit)");
  deps.wait_below_minimum = !o.exit_below_minimum && (!root.empty() || o.wait_for_nodes.has_value());
  deps.wait_for_nodes_ms = o.wait_for_nodes.value_or(0) * 1000;
  deps.adopt_wait_ms = o.adopt_wait * 1000;
  deps.grace_ms = o.grace * 1000;
  deps.loss_window_ms = 2.0 * job.cluster.heartbeat_interval_ms;
  inject_coordinator_faults(deps, o, log);
  const auto records = install_records(deps, o, job);
  if (steps > 0) {
    // Refuse a job that cannot be planned on the expected nodes before anyone registers.
    planning::plan_job(deps.profile, deps.job);
  }
  auto coord = actors::spawn_coordinator(sys, deps);
  auto port = publish_coordinator(sys, coord, at);
  if (!port) {
    actors::stop_coordinator(sys, coord);
    throw messages::input_error("--listen: cannot listen on " + o.listen + ": " + sys.render(port.error()));
  }
  log("listening on " + at.host + ":" + std::to_string(*port) + " (job " +
      deps.policy.job_hash.substr(0, 12) + ", protocol " + std::to_string(messages::protocol_version) +
      ", " + describe_tls(tls) + "), waiting for " + std::to_string(nodes) + " node(s)");
  if (!o.address_file.empty()) {
    const std::string temp = o.address_file + ".tmp";
    std::ofstream(temp) << at.host << ":" << *port << "\n";
    std::error_code ec;
    std::filesystem::rename(temp, o.address_file, ec);
    if (ec) log("cannot write the address file " + o.address_file + ": " + ec.message());
  }
  if (http_server) {
    http_server->start(
        [&sys, coord, token](std::function<void(status_reply)> done) {
          request_status(sys, coord, token, std::chrono::seconds(5), std::move(done));
        },
        [history = records.history](std::function<void(std::string)> done) { done(history->json().dump() + "\n"); });
    log("http on " + http_at.host + ":" + std::to_string(http_server->port()) +
        " (GET / for the dashboard, GET /status, GET /history, GET /metrics)");
  }
  signals.start(sys, coord, token, log);

  caf::error reason;
  caf::scoped_actor self{sys};
  self->monitor(coord);
  self->receive([&](caf::down_msg& dm) { reason = dm.reason; });
  signals.stop();
  http_server.reset();  // before the actor system it asks goes away
  if (*records.stopped_by_policy) {
    std::cerr << "error: the job stopped: too few nodes or layers left to continue (see the log above)\n";
    return exit_checkpoint_and_stop;
  }
  if (messages::is_protocol_error(reason) &&
      reason.code() == static_cast<std::uint8_t>(messages::protocol_error::superseded)) {
    std::cerr << "error: " << messages::describe(reason) << "\n";
    return 5;
  }
  if (reason && reason != caf::exit_reason::user_shutdown) {
    std::cerr << "error: the job failed: " << messages::describe(reason) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace oobleck::apps
