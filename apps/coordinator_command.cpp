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
#include "apps/flags.hpp"
#include "apps/http_status.hpp"
#include "apps/job_file.hpp"
#include "apps/run_history.hpp"
#include "apps/tls.hpp"
#include "messages/event_json.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "messages/profile_json.hpp"
#include "planning/synthetic_profile.hpp"
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

/// What a profile must have been measured for to plan this job.
planning::profile_expectation expected_of(const job_file& job) {
  return {.microbatch_size = job.training.microbatch, .gpus_per_node = job.cluster.slots_per_node,
          .config_hash = job.model.hash(), .device_kind = std::nullopt};
}

/// The file a profile measured at job start is kept in, in `folder`: one per model config,
/// microbatch, slots per node, device kind and precision (the job's cluster.device and
/// training.precision: a CPU profile is never read back for a job on GPUs, nor an fp32 one for bf16).
std::string profile_cache_file(const std::string& folder, const job_file& job) {
  return (std::filesystem::path(folder) / ("profile-" + job.model.hash() + "-mb" +
                                           std::to_string(job.training.microbatch) + "-slots" +
                                           std::to_string(job.cluster.slots_per_node) + "-" + job.cluster.device +
                                           (job.model.precision == runtime::precision_kind::fp32
                                                ? std::string()
                                                : "-" + runtime::precision_name(job.model.precision)) +
                                           ".json"))
      .string();
}

/// The profile the job is planned from (ARCHITECTURE.md §4 "Profile at job start"): --profile,
/// else [profile] file, else one this job measured at an earlier start (its cache file); none of
/// these: measured on one of its nodes once they are admitted (deps.profile_at_start). A profile
/// of another job is refused (a given one), or measured again (a cached one).
void choose_profile(actors::coordinator_deps& deps, const job_file& job, const std::string& given,
                    const std::string& cache_folder, const std::function<void(const std::string&)>& log) {
  const std::string file = !given.empty() ? given : job.profile.file;
  if (!file.empty()) {
    deps.profile = messages::read_profile_file(file);
    planning::check_matches(deps.profile, expected_of(job));
    log("planning from the profile " + file);
    return;
  }
  const std::string cached = cache_folder.empty() ? std::string() : profile_cache_file(cache_folder, job);
  if (!cached.empty() && std::filesystem::exists(cached)) {
    try {
      deps.profile = messages::read_profile_file(cached);
      planning::check_matches(deps.profile, expected_of(job));
      log("planning from the profile this job measured at an earlier start: " + cached);
      return;
    } catch (const std::exception& e) {
      log("not using the cached profile " + cached + " (" + e.what() + "): measuring the model again");
    }
  }
  deps.profile = modelled_profile(job);
  deps.profile_at_start = true;
  deps.accept_profile = [expected = expected_of(job)](const std::string& text) {
    auto p = messages::profile_from_json(text);
    planning::validate(p);
    planning::check_matches(p, expected);
    return p;
  };
  if (cached.empty()) return;
  deps.on_profiled = [cached, log](const planning::profile& p) {
    // Kept for the job's next start (a replacement coordinator, a resume): written whole, then
    // renamed, so a reader never meets half a file.
    try {
      std::filesystem::create_directories(std::filesystem::path(cached).parent_path());
      const std::string temp = cached + ".tmp";
      messages::write_profile_json(p, temp);
      std::filesystem::rename(temp, cached);
      log("kept the measured profile in " + cached);
    } catch (const std::exception& e) {
      log("could not keep the measured profile in " + cached + ": " + e.what());
    }
  };
}

}  // namespace

int run_coordinator_command(const std::vector<std::string>& args, std::ostream& out, std::ostream&) {
  CLI::App app{"oobleck-coordinator: the job's coordinator. Workers register with it (proving the\n"
               "job token), it plans and drives the training, and operators query it (oobleck-ctl).",
               "oobleck-coordinator"};
  std::string listen, config, token_file = "oobleck.token";
  std::optional<int> nodes_flag, fault_tolerance_flag;
  std::optional<std::int64_t> steps_flag;
  std::string metrics_out, events_out, address_file, http, checkpoint_dir, resume, resume_command;
  std::optional<std::int64_t> checkpoint_every;
  tls_flags tls_given;
  add_text(app, "--listen", listen, "HOST:PORT to accept workers and operators on (PORT 0: any free port)")
      ->type_name("HOST:PORT")
      ->required();
  add_text(app, "--config", config, "the job file (TOML); workers receive it when admitted")
      ->type_name("JOB.toml")
      ->required();
  add_text(app, "--token-file", token_file,
           "the job token; created (mode 0600) with a fresh random token if absent (default: oobleck.token)")
      ->type_name("FILE");
  add_integer(app, "--nodes", nodes_flag, 1, 4096,
              "nodes to wait for before the job starts (default: the job's cluster.nodes)");
  add_integer(app, "--steps", steps_flag, 0, std::int64_t{1} << 40,
              "steps to train, then stop (default: the job's training.steps; 0: admit workers and "
              "serve status only)");
  add_integer(app, "--fault-tolerance", fault_tolerance_flag, 0, 64,
              "f: the plan keeps at least f+1 pipelines (default: the job's cluster.fault_tolerance)");
  add_text(app, "--metrics-out", metrics_out, "append one JSON line per committed step to FILE")->type_name("FILE");
  add_text(app, "--events-out", events_out,
           "append one JSON line per job event to FILE (node joined or lost, epoch forming or formed, step "
           "committed or failed, checkpoint written, stopped), flushed as it happens: what programs read "
           "instead of the log lines")
      ->type_name("FILE");
  add_text(app, "--address-file", address_file,
           "once listening, write HOST:PORT (and a newline) to FILE (written whole, by a rename)")
      ->type_name("FILE");
  add_text(app, "--http", http,
           "HOST:PORT to serve the dashboard (GET /), GET /status and GET /history (JSON) and GET /metrics "
           "(Prometheus) on (PORT 0: any free port; default: the job's http.port on the --listen host, off "
           "when it is 0)")
      ->type_name("HOST:PORT");
  add_text(app, "--checkpoint-dir", checkpoint_dir,
           "where checkpoints are written, on a filesystem every node shares (default: the job's "
           "[checkpoint] dir; none: no checkpoints, and a stop by the policy loses the trained state). "
           "A checkpoint is also written before the job stops as failed, on the first SIGTERM/SIGINT "
           "(a second stops at once) and on oobleck-ctl shutdown --checkpoint")
      ->type_name("DIR");
  add_integer(app, "--checkpoint-every", checkpoint_every, 0, std::int64_t{1} << 40,
              "write a checkpoint after every K committed steps (default: the job's [checkpoint] every; "
              "0: only when the policy stops the job)");
  add_text(app, "--resume", resume,
           "continue the job from the checkpoint in DIR (a step-N directory, or the checkpoint directory "
           "itself: then its newest complete checkpoint valid for the job, named in a line): it is validated "
           "in full against the job first, then training starts at its step")
      ->type_name("DIR");
  add_text(app, "--resume-command", resume_command,
           "for launchers: the command printed to resume the job, before ' --resume DIR' (default: this "
           "command line)")
      ->type_name("COMMAND");
  double adopt_wait = 10;
  add_number(app, "--adopt-wait", adopt_wait, 0,
             "a replacement coordinator (workers come back with the state of a job in progress) waits this many "
             "seconds at most for the nodes of the job's newest epoch, then goes on with those back (default 10)");
  double grace = 60;
  add_number(app, "--coordinator-grace", grace, 0,
             "a coordinator that lost every node at once (it was frozen or cut off, not they) waits this many seconds "
             "for them to come back with their state before it stops (default 60; the workers' --coordinator-grace "
             "should be the same)");
  std::string profile_file;
  add_text(app, "--profile", profile_file,
           "FILE: plan from this profile (oobleck-profile's, JSON or Cap'n Proto) instead of the job's [profile] file; "
           "with neither, the job's model is measured on one of its nodes before the first plan (cached under "
           "[profile] cache, else the checkpoint directory, for the job's next start)")
      ->type_name("FILE");
  std::string profile_cache;
  add_text(app, "--profile-cache", profile_cache,
           "DIR: where a profile measured at the job's start is kept for its next start, or read from (default: the "
           "job's [profile] cache, else the checkpoint directory)")
      ->type_name("DIR");
  std::optional<std::int64_t> digest_every;
  app.add_option("--digest-every", digest_every,
                 "N: every holder of every layer reports its parameters' digest, and the coordinator compares the "
                 "replicas, on every Nth step (1: every step), besides the first step of every epoch and the job's "
                 "last step (default: the job's [faults] digest_every, 100)")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  bool exit_below_minimum = false;
  std::optional<double> wait_for_nodes;
  app.add_flag("--exit-below-minimum", exit_below_minimum,
               "when the reconfiguration policy says checkpoint and stop (fewer than (f+1)*n0 nodes, or a layer with no "
               "surviving holder), write the checkpoint and exit with status 4 instead of waiting for nodes");
  app.add_option("--wait-for-nodes", wait_for_nodes,
                 "SECONDS: below the minimum, wait at most this many seconds for nodes to join before stopping as "
                 "--exit-below-minimum does (0: no limit, the default). The job waits by default when it has a "
                 "checkpoint directory; this flag makes it wait without one too (it resumes from the survivors' "
                 "memory, which needs every layer to keep a holder)")
      ->check(CLI::NonNegativeNumber);
  // Fault injection into the coordinator itself (oobleck-local --kill-coordinator-at and
  // --hang-coordinator-at pass these; hidden: not for operators).
  std::optional<std::int64_t> kill_self_at, partial_commit_at;
  std::string hang_self_at;
  app.add_option("--kill-self-at", kill_self_at, "SIGKILL this coordinator in the middle of step STEP (when its first pipeline reports done)")->group("");
  app.add_option("--hang-self-at", hang_self_at, "STEP:SECONDS: freeze this coordinator as step STEP is sent")
      ->group("");
  app.add_option("--partial-commit-at", partial_commit_at,
                 "testing: at step STEP's commit, tell the first node only, then die")
      ->group("");
  add_tls_flags(app, tls_given);
  app.footer("Exit status: 0 finished (or stopped by an operator), 1 internal error, 2 bad input (flags, job "
             "file, TLS files, a checkpoint that is not valid for --resume), 4 the reconfiguration policy stopped the job "
             "(fewer than (f+1)*n0 nodes, or a layer with no surviving holder) and it did not wait for nodes "
             "(--exit-below-minimum, no checkpoint directory, or --wait-for-nodes ran out): a checkpoint was written when "
             "possible and its resume command printed; 5 a newer coordinator adopted the job (this one was frozen or cut off "
             "and replaced): it changed nothing.");
  if (!parse_flags(app, args, out)) return 0;

  const host_port at = parse_host_port("--listen", listen, true);
  const std::string job_text = read_text(config);
  const job_file job = read_job_file(config);  // refuse a bad job file before anything listens
  const tls_section tls = resolve_tls(job.tls, tls_given);
  // The coordinator needs no GPU, but it draws each epoch's NCCL id, which needs NCCL.
  if (job.cluster.data_plane == "nccl" && !runtime::built_with_cuda())
    throw messages::input_error("cluster.data_plane \"nccl\": the coordinator draws every epoch's NCCL id: " +
                                runtime::no_cuda_build_reason());
  const int nodes = nodes_flag.value_or(job.cluster.nodes);
  const int fault_tolerance = fault_tolerance_flag.value_or(job.cluster.fault_tolerance);
  const std::int64_t steps = steps_flag.value_or(static_cast<std::int64_t>(job.training.steps));
  auto log = progress_printer("coordinator");
  std::string token;
  if (std::ifstream(token_file).good()) {
    token = actors::read_token_file(token_file);
  } else {
    token = actors::create_token_file(token_file);
    log("created the token file " + token_file + " (mode 0600): give it to every worker");
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
  if (!http.empty()) http_at = parse_host_port("--http", http, true);
  if (!http.empty() || job.http.port != 0) {
    try {
      http_server = std::make_unique<http_status_server>(http_at.host, http_at.port);
    } catch (const messages::input_error& e) {
      throw messages::input_error((http.empty() ? "http.port: " : "--http: ") + std::string(e.what()));
    }
  }
  actors::coordinator_deps deps;
  deps.policy = {token, actors::sha256_hex(job_text), messages::protocol_version, job.cluster.slots_per_node,
                 job.cluster.device, job.cluster.data_plane == "nccl"};
  deps.job_toml = job_text_for_workers(job_text, config);  // relative data paths resolved for every worker
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
  deps.faults.digest_every =
      digest_every ? static_cast<std::uint64_t>(*digest_every) : job.faults.digest_every;
  deps.clip_norm = job.optimizer.clip_norm;
  deps.run_ahead = true;  // the next step's orders go out with each commit (coordinator_deps::run_ahead)
  if (job.cluster.data_plane == "nccl") deps.new_nccl_id = runtime::new_nccl_unique_id;
  const std::string root = !checkpoint_dir.empty() ? checkpoint_dir : job.checkpoint.dir;
  // Refused now (checkpoint_error is bad input), not at the first checkpoint hours into the job,
  // which would go on without one, saying so at every attempt.
  if (!root.empty())
    runtime::ensure_checkpoint_root(root, (!checkpoint_dir.empty() ? "--checkpoint-dir " : "[checkpoint] dir ") + root);
  choose_profile(deps, job, profile_file,
                 !profile_cache.empty() ? profile_cache : !job.profile.cache.empty() ? job.profile.cache : root, log);
  const auto every = static_cast<std::uint64_t>(checkpoint_every.value_or(static_cast<std::int64_t>(job.checkpoint.every)));
  if (every > 0 && root.empty())
    throw messages::input_error("--checkpoint-every: needs a checkpoint directory (--checkpoint-dir or [checkpoint] dir)");
  deps.checkpoint = checkpoint_deps_for(job, root, every);
  if (!resume.empty()) {
    if (const auto chosen = resume_from(deps.checkpoint, job, resume); !chosen.empty()) log(chosen);
    if (deps.checkpoint.resume_step >= deps.steps)
      throw messages::input_error("--resume: the checkpoint is at step " + std::to_string(deps.checkpoint.resume_step) +
                                  ": nothing is left of the job's " + std::to_string(steps) + " step(s)");
    log("resuming from " + deps.checkpoint.resume_dir + ": training starts at step " +
        std::to_string(deps.checkpoint.resume_step));
  }
  deps.checkpoint.resume_command = [prefix = resume_command, args](const std::string& dir) {
    return prefix.empty() ? resume_command_line("oobleck-coordinator", args, dir) : resume_command_line(prefix, {}, dir);
  };
  if (exit_below_minimum && wait_for_nodes)
    throw messages::input_error("--wait-for-nodes and --exit-below-minimum: choose one (wait for nodes, or exit)");
  deps.wait_below_minimum = !exit_below_minimum && (!root.empty() || wait_for_nodes.has_value());
  deps.wait_for_nodes_ms = wait_for_nodes.value_or(0) * 1000;
  deps.adopt_wait_ms = adopt_wait * 1000;
  deps.grace_ms = grace * 1000;
  deps.loss_window_ms = 2.0 * job.cluster.heartbeat_interval_ms;
  std::optional<std::pair<std::uint64_t, double>> hang;
  if (!hang_self_at.empty()) hang = parse_step_seconds("--hang-self-at", hang_self_at);
  if (kill_self_at) {
    // When the first pipeline of step K reports it done: the step's orders are out, its stages
    // compute, and its commit is not decided, however late this process is scheduled.
    deps.on_first_pipeline_done = [kill_at = *kill_self_at, log](std::uint64_t step) {
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
  if (partial_commit_at) {
    deps.partial_commit_at = static_cast<std::uint64_t>(*partial_commit_at);
    deps.die = [] {
      // Long enough for the one commit_step to leave this process.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    };
  }
  auto stopped_by_policy = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::ofstream> metrics;
  if (!metrics_out.empty()) {
    metrics = std::make_shared<std::ofstream>(metrics_out, std::ios::app);
    if (!*metrics) throw messages::input_error("--metrics-out: cannot write " + metrics_out);
    write_metrics_records(deps, metrics);
  }
  if (!events_out.empty()) {
    auto events = std::make_shared<std::ofstream>(events_out, std::ios::app);
    if (!*events) throw messages::input_error("--events-out: cannot write " + events_out);
    deps.on_event = [events](const messages::job_event& e) {
      *events << messages::event_json({e, messages::unix_ms_now()}).dump() << std::endl;
    };
  }
  deps.checkpoint.on_stop = [metrics, stopped_by_policy](const actors::checkpoint_stop_record& r) {
    *stopped_by_policy = true;
    if (!metrics) return;
    nlohmann::ordered_json j;
    j["event"] = "checkpoint_and_stop";
    j["reason"] = r.reason;
    j["dir"] = r.dir ? nlohmann::ordered_json(*r.dir) : nlohmann::ordered_json(nullptr);
    j["latest"] = r.latest ? nlohmann::ordered_json(*r.latest) : nlohmann::ordered_json(nullptr);
    j["step"] = r.step;
    *metrics << j.dump() << std::endl;
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
    if (!metrics) return;
    nlohmann::ordered_json j;
    j["event"] = "eval";
    j["step"] = r.step;
    j["loss"] = r.loss;
    j["windows"] = r.windows;
    j["epoch"] = r.epoch;
    j["wall_ms"] = r.wall_ms;
    *metrics << j.dump() << std::endl;
  };
  if (steps > 0) {
    // Refuse a job that cannot be planned on the expected nodes before anyone registers.
    planning::plan_job(deps.profile, deps.job);
  }
  auto coord = actors::spawn_coordinator(sys, deps);
  auto port = publish_coordinator(sys, coord, at);
  if (!port) {
    actors::stop_coordinator(sys, coord);
    throw messages::input_error("--listen: cannot listen on " + listen + ": " + sys.render(port.error()));
  }
  log("listening on " + at.host + ":" + std::to_string(*port) + " (job " +
      deps.policy.job_hash.substr(0, 12) + ", protocol " + std::to_string(messages::protocol_version) +
      ", " + describe_tls(tls) + "), waiting for " + std::to_string(nodes) + " node(s)");
  if (!address_file.empty()) {
    const std::string temp = address_file + ".tmp";
    std::ofstream(temp) << at.host << ":" << *port << "\n";
    std::error_code ec;
    std::filesystem::rename(temp, address_file, ec);
    if (ec) log("cannot write the address file " + address_file + ": " + ec.message());
  }
  if (http_server) {
    http_server->start(
        [&sys, coord, token](std::function<void(status_reply)> done) {
          request_status(sys, coord, token, std::chrono::seconds(5), std::move(done));
        },
        [history](std::function<void(std::string)> done) { done(history->json().dump() + "\n"); });
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
  if (*stopped_by_policy) {
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
