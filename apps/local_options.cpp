// oobleck-local's flags: see local_options.hpp.

#include "apps/local_options.hpp"

#include <CLI/CLI.hpp>

#include <ostream>

#include "apps/flags.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

const char* const default_local_job = R"(# oobleck-local's default job: a small GPT on the generated corpus, 6 nodes, f = 1.
# The slot memory is set so that the model does not fit one node (n0 = 2): pipelines span nodes.
[model]
vocab = 256
d_model = 32
heads = 2
blocks = 4
seq_len = 32
dropout = 0.0
seed = 1234

[data]
corpus_bytes = 1048576
corpus_seed = 7

[training]
steps = 20
global_batch = 16
microbatch = 2
seed = 1

[optimizer]
lr = 0.003
schedule = "cosine"
warmup_steps = 5
min_lr = 0.0003

[cluster]
nodes = 6
fault_tolerance = 1
device_memory_bytes = 1500000
)";

namespace {

/// --fail-at / --hang-at / --error-at / --stall-at STEP:ID[,ID...]: one fault of `kind` per node;
/// error and stall take an optional /N: at most N attempts of the step (default: every attempt).
void add_faults(std::vector<messages::inject_fault>& faults, const std::string& flag, const std::string& given,
                messages::fault_kind kind) {
  const bool every_attempt = kind == messages::fault_kind::error || kind == messages::fault_kind::stall;
  std::string spec = given;
  std::int32_t attempts = 0;
  if (const auto slash = spec.find('/'); slash != std::string::npos && every_attempt) {
    const auto n = parse_id_list(flag, spec.substr(slash + 1));
    if (n.size() != 1 || n[0] < 1) throw messages::input_error(flag + ": expected /N with N >= 1 after the ids, got '" + given + "'");
    attempts = n[0];
    spec = spec.substr(0, slash);
  }
  const auto colon = spec.find(':');
  if (colon == std::string::npos)
    throw messages::input_error(flag + ": expected STEP:ID[,ID...]" + (every_attempt ? "[/N]" : "") + ", got '" + given + "'");
  const auto step = parse_id_list(flag, spec.substr(0, colon));
  if (step.size() != 1) throw messages::input_error(flag + ": expected one step before ':', got '" + given + "'");
  for (int id : parse_id_list(flag, spec.substr(colon + 1))) faults.push_back({id, kind, step[0], 0, attempts});
}

/// --join-at STEP:K, or waiting:K.
std::pair<std::int64_t, int> join_of(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon != std::string::npos && spec.substr(0, colon) == "waiting") {
    const auto k = parse_id_list("--join-at", spec.substr(colon + 1));
    if (k.size() != 1 || k[0] < 1) throw messages::input_error("--join-at: expected waiting:K with K >= 1, got '" + spec + "'");
    return {join_when_waiting, k[0]};
  }
  const auto parts = colon == std::string::npos
                         ? std::vector<int>{}
                         : parse_id_list("--join-at", spec.substr(0, colon) + "," + spec.substr(colon + 1));
  if (parts.size() != 2 || parts[1] < 1)
    throw messages::input_error("--join-at: expected STEP:K with K >= 1, got '" + spec + "'");
  return {parts[0], parts[1]};
}

}  // namespace

std::optional<local_options> parse_local_options(const std::vector<std::string>& args, std::ostream& out) {
  CLI::App app{"oobleck-local: runs a whole job on this machine: a coordinator and N worker processes\n"
               "on 127.0.0.1, with their progress on stdout. With no arguments: the default job (a small\n"
               "GPT on the generated corpus, 6 nodes, f = 1, pipelines spanning nodes).",
               "oobleck-local"};
  local_options o;
  std::vector<std::string> fail_at, hang_at, error_at, stall_at, join_at;
  add_integer(app, "--nodes", o.nodes, 1, 64, "worker processes (default: the job's cluster.nodes, 6 for the default job)");
  add_text(app, "--config", o.config, "the job file (default: the built-in default job)")->type_name("JOB.toml");
  add_integer(app, "--steps", o.steps, 1, std::int64_t{1} << 40,
              "steps to train (default: the job's training.steps, 20 for the default job)");
  add_integer(app, "--fault-tolerance", o.fault_tolerance, 0, 64, "f (default: the job's cluster.fault_tolerance)");
  add_text(app, "--metrics-out", o.metrics_out, "one JSON line per committed step to FILE")->type_name("FILE");
  add_text(app, "--events-out", o.events_out,
           "one JSON line per job event to FILE (node joined, lost or refused; epoch forming or formed; step "
           "committed or failed; commit stood; checkpoint written; stopped, with the outcome), written as they "
           "happen: what scripts should read, rather than the progress lines (which are for people)")
      ->type_name("FILE");
  add_number(app, "--timeout", o.timeout_s, 1, "give up (and stop every process) after this many seconds (default 600)");
  app.add_option("--fail-at", fail_at,
                 "STEP:ID[,ID...]: those nodes' processes kill themselves (SIGKILL) in the middle of "
                 "step STEP (repeatable)")
      ->type_name("STEP:IDS");
  app.add_option("--hang-at", hang_at,
                 "STEP:ID[,ID...]: those nodes' processes freeze (SIGSTOP) in the middle of step STEP; "
                 "the heartbeat timeout declares them lost (repeatable)")
      ->type_name("STEP:IDS");
  app.add_option("--error-at", error_at,
                 "STEP:ID[,ID...][/N]: those nodes' stages throw (a c10::Error, \"injected: out of memory\") in the "
                 "middle of every attempt of step STEP (at most N attempts with /N); the epoch is aborted and the step "
                 "runs again; a node that fails [faults] evict_after times in a row is evicted (repeatable)")
      ->type_name("STEP:IDS");
  app.add_option("--stall-at", stall_at,
                 "STEP:ID[,ID...][/N]: those nodes' stages busy-loop inside their compute in every attempt of step STEP "
                 "(at most N with /N) while the process stays responsive; the step deadline names them and a node that "
                 "stalls [faults] evict_after_stalls times is evicted (repeatable)")
      ->type_name("STEP:IDS");
  app.add_option("--join-at", join_at,
                 "STEP:K: start K more worker processes when step STEP has committed; they join at the "
                 "next step boundary and take the next node ids; waiting:K: when the job first waits for nodes "
                 "(below its minimum) (repeatable)")
      ->type_name("STEP:K");
  add_text(app, "--trace", o.trace_path,
           "replay a node availability trace (lines 'ms,add|remove,nodeN', e.g. ../shared/traces/10m.csv): "
           "its removals kill workers (kill -9), its later adds start workers (joins); trace time 0 is the "
           "first epoch; the run ends at the trace's last time (or --steps)")
      ->type_name("FILE");
  add_number(app, "--time-scale", o.time_scale, 0,
             "with --trace: multiply trace times by X > 0 (0.01 replays 10 minutes in 6 s; default 1)");
  add_integer(app, "--trace-nodes", o.trace_nodes, 1, 64,
              "with --trace: at most N workers at once (default: --nodes, else the job's cluster.nodes); the trace's "
              "nodes take free slots in the order they are added, the rest wait as spares")
      ->type_name("N");
  std::vector<std::string> kill_coordinator;
  app.add_option("--kill-coordinator-at", kill_coordinator,
                 "STEP[:commit]: the coordinator kills itself (SIGKILL) in the middle of step STEP (with :commit, once "
                 "it decided the step's commit and told one node only); oobleck-local starts a replacement at the same "
                 "address, which adopts the job from the workers' memory (repeatable: the Nth goes to the Nth "
                 "coordinator)")
      ->type_name("STEP");
  app.add_option("--hang-coordinator-at", o.hang_coordinator_at,
                 "STEP:SECONDS: the coordinator freezes (SIGSTOP) in the middle of step STEP for SECONDS (longer than "
                 "the connection timeout: the workers lose it, keep their state and wait for it to come back)")
      ->type_name("STEP:SECONDS");
  add_text(app, "--profile", o.profile,
           "FILE: plan from this profile (oobleck-profile's) instead of the job's [profile] file; with neither, a "
           "worker measures the job's model before the first plan (a few seconds for the default job)")
      ->type_name("FILE");
  app.add_option("--digest-every", o.digest_every,
                 "N: the replicas of every layer are compared (digests) on every Nth step (1: every step), besides the "
                 "first step of every epoch and the last (default: the job's [faults] digest_every, 100)")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  add_number(app, "--coordinator-grace", o.coordinator_grace_s, 0,
             "seconds a worker that lost its coordinator keeps its state and waits for one (default 60)");
  app.add_flag("--exit-below-minimum", o.exit_below_minimum,
               "when too few nodes are left (fewer than (f+1)*n0, or a layer without a holder), write the checkpoint "
               "and exit with status 4 instead of waiting for nodes");
  app.add_flag("--no-fork-server", o.no_fork_server,
               "start every worker as a program of its own; by default the workers on cpu are copies (fork) of one "
               "oobleck-worker that loaded LibTorch once, which saves each ~1 s of CPU");
  app.add_option("--wait-for-nodes", o.wait_for_nodes_s,
                 "SECONDS: below the minimum, wait at most this long for nodes (0: no limit, the default), then exit 4; "
                 "the job waits by default with a checkpoint directory, and always with --trace")
      ->check(CLI::NonNegativeNumber);
  add_text(app, "--device", o.device,
           "where the stages compute, instead of the job's cluster.device: cpu, or cuda (every worker on GPU 0, or "
           "worker i on GPU i with cluster.data_plane \"nccl\"; a build with OOBLECK_WITH_CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->type_name("cpu|cuda");
  add_text(app, "--checkpoint-dir", o.checkpoint_dir, "where checkpoints go (default: the job's [checkpoint] dir)")
      ->type_name("DIR");
  add_integer(app, "--checkpoint-every", o.checkpoint_every, 0, std::int64_t{1} << 40,
              "a checkpoint after every K committed steps (default: the job's [checkpoint] every)");
  add_text(app, "--resume", o.resume,
           "continue from the checkpoint in DIR (a step-N folder, or the checkpoint folder: then its newest complete "
           "checkpoint); validated against the job first")
      ->type_name("DIR");
  app.footer("Exit status: the coordinator's: 0 finished, 1 internal error, 2 bad input, 4 the reconfiguration "
             "policy stopped the job (too few nodes left, and it did not wait for nodes): a checkpoint was written "
             "when possible and the command that resumes it printed. A coordinator that dies (a signal) is started again at the same "
             "address, as systemd or a Slurm step would: the replacement adopts the job from the workers' memory.");
  add_tls_flags(app, o.tls);
  app.add_flag("--print-default-job", o.print_default_job, "print the default job file and exit (a start for your own)");
  if (!parse_flags(app, args, out)) return std::nullopt;
  for (const auto& f : fail_at) add_faults(o.faults, "--fail-at", f, messages::fault_kind::kill);
  for (const auto& h : hang_at) add_faults(o.faults, "--hang-at", h, messages::fault_kind::hang);
  for (const auto& e : error_at) add_faults(o.faults, "--error-at", e, messages::fault_kind::error);
  for (const auto& s : stall_at) add_faults(o.faults, "--stall-at", s, messages::fault_kind::stall);
  for (const auto& j : join_at) o.joins.push_back(join_of(j));
  for (const auto& k : kill_coordinator) {
    std::string step = k;
    bool after_commit = false;
    if (step.size() > 7 && step.substr(step.size() - 7) == ":commit") {
      after_commit = true;
      step.resize(step.size() - 7);
    }
    try {
      std::size_t used = 0;
      const std::int64_t at = std::stoll(step, &used);
      if (used != step.size() || at < 0) throw std::invalid_argument("not a step");
      o.kill_coordinator_at.push_back({at, after_commit});
    } catch (const std::exception&) {
      throw messages::input_error("--kill-coordinator-at: expected STEP or STEP:commit, got '" + k + "'");
    }
  }
  if (!o.hang_coordinator_at.empty()) parse_step_seconds("--hang-coordinator-at", o.hang_coordinator_at);  // checked here
  if (o.exit_below_minimum && o.wait_for_nodes_s)
    throw messages::input_error("--wait-for-nodes and --exit-below-minimum: choose one (wait for nodes, or exit)");
  const bool time_scale_given = app.get_option("--time-scale")->count() > 0;
  if (o.trace_path.empty()) {
    if (time_scale_given) throw messages::input_error("--time-scale goes with --trace");
    if (o.trace_nodes) throw messages::input_error("--trace-nodes goes with --trace");
  } else {
    if (!o.faults.empty() || !o.joins.empty())
      throw messages::input_error(
          "--trace replaces --fail-at, --hang-at, --error-at, --stall-at and --join-at: give one or the other");
    if (!(o.time_scale > 0)) throw messages::input_error("--time-scale must be > 0, got 0");
  }
  return o;
}

}  // namespace oobleck::apps
