#include "apps/coordinator_options.hpp"

#include <CLI/CLI.hpp>

#include "apps/flags.hpp"

namespace oobleck::apps {

void add_coordinator_flags(CLI::App& app, coordinator_options& o) {
  add_text(app, "--listen", o.listen, "HOST:PORT to accept workers and operators on (PORT 0: any free port)")
      ->type_name("HOST:PORT")
      ->required();
  add_text(app, "--config", o.config, "the job file (TOML); workers receive it when admitted")
      ->type_name("JOB.toml")
      ->required();
  add_text(app, "--token-file", o.token_file,
           "the job token; created (mode 0600) with a fresh random token if absent (default: oobleck.token)")
      ->type_name("FILE");
  add_integer(app, "--nodes", o.nodes, 1, 4096,
              "nodes to wait for before the job starts (default: the job's cluster.nodes)");
  add_integer(app, "--steps", o.steps, 0, std::int64_t{1} << 40,
              "steps to train, then stop (default: the job's training.steps; 0: admit workers and "
              "serve status only)");
  add_integer(app, "--fault-tolerance", o.fault_tolerance, 0, 64,
              "f: the plan keeps at least f+1 pipelines (default: the job's cluster.fault_tolerance)");
  add_text(app, "--metrics-out", o.metrics_out, "append one JSON line per committed step to FILE")->type_name("FILE");
  add_text(app, "--events-out", o.events_out,
           "append one JSON line per job event to FILE (node joined or lost, epoch forming or formed, step "
           "committed or failed, checkpoint written, stopped), flushed as it happens: what programs read "
           "instead of the log lines")
      ->type_name("FILE");
  add_text(app, "--address-file", o.address_file,
           "once listening, write HOST:PORT (and a newline) to FILE (written whole, by a rename)")
      ->type_name("FILE");
  add_text(app, "--http", o.http,
           "HOST:PORT to serve the dashboard (GET /), GET /status and GET /history (JSON) and GET /metrics "
           "(Prometheus) on (PORT 0: any free port; default: the job's http.port on the --listen host, off "
           "when it is 0)")
      ->type_name("HOST:PORT");
  add_text(app, "--checkpoint-dir", o.checkpoint_dir,
           "where checkpoints are written, on a filesystem every node shares (default: the job's "
           "[checkpoint] dir; none: no checkpoints, and a stop by the policy loses the trained state). "
           "A checkpoint is also written before the job stops as failed, on the first SIGTERM/SIGINT "
           "(a second stops at once) and on oobleck-ctl shutdown --checkpoint")
      ->type_name("DIR");
  add_integer(app, "--checkpoint-every", o.checkpoint_every, 0, std::int64_t{1} << 40,
              "write a checkpoint after every K committed steps (default: the job's [checkpoint] every; "
              "0: only when the policy stops the job)");
  add_text(app, "--resume", o.resume,
           "continue the job from the checkpoint in DIR (a step-N directory, or the checkpoint directory "
           "itself: then its newest complete checkpoint valid for the job, named in a line): it is validated "
           "in full against the job first, then training starts at its step")
      ->type_name("DIR");
  add_text(app, "--resume-command", o.resume_command,
           "for launchers: the command printed to resume the job, before ' --resume DIR' (default: this "
           "command line)")
      ->type_name("COMMAND");
  add_number(app, "--adopt-wait", o.adopt_wait, 0,
             "a replacement coordinator (workers come back with the state of a job in progress) waits this many "
             "seconds at most for the nodes of the job's newest epoch, then goes on with those back (default 10)");
  add_number(app, "--coordinator-grace", o.grace, 0,
             "a coordinator that lost every node at once (it was frozen or cut off, not they) waits this many seconds "
             "for them to come back with their state before it stops (default 60; the workers' --coordinator-grace "
             "should be the same)");
  add_text(app, "--profile", o.profile_file,
           "FILE: plan from this profile (oobleck-profile's, JSON or Cap'n Proto) instead of the job's [profile] file; "
           "with neither, the job's model is measured on one of its nodes before the first plan (cached under "
           "[profile] cache, else the checkpoint directory, for the job's next start)")
      ->type_name("FILE");
  add_text(app, "--profile-cache", o.profile_cache,
           "DIR: where a profile measured at the job's start is kept for its next start, or read from (default: the "
           "job's [profile] cache, else the checkpoint directory)")
      ->type_name("DIR");
  app.add_option("--digest-every", o.digest_every,
                 "N: every holder of every layer reports its parameters' digest, and the coordinator compares the "
                 "replicas, on every Nth step (1: every step), besides the first step of every epoch and the job's "
                 "last step (default: the job's [faults] digest_every, 100)")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  app.add_flag(
      "--exit-below-minimum", o.exit_below_minimum,
      "when the reconfiguration policy says checkpoint and stop (fewer than (f+1)*n0 nodes, or a layer with no "
      "surviving holder), write the checkpoint and exit with status 4 instead of waiting for nodes");
  app.add_option("--wait-for-nodes", o.wait_for_nodes,
                 "SECONDS: below the minimum, wait at most this many seconds for nodes to join before stopping as "
                 "--exit-below-minimum does (0: no limit, the default). The job waits by default when it has a "
                 "checkpoint directory; this flag makes it wait without one too (it resumes from the survivors' "
                 "memory, which needs every layer to keep a holder)")
      ->check(CLI::NonNegativeNumber);
  // Fault injection into the coordinator itself (oobleck-local --kill-coordinator-at and
  // --hang-coordinator-at pass these; hidden: not for operators).
  app.add_option("--kill-self-at", o.kill_self_at,
                 "SIGKILL this coordinator in the middle of step STEP (when its first pipeline reports done)")
      ->group("");
  app.add_option("--hang-self-at", o.hang_self_at, "STEP:SECONDS: freeze this coordinator as step STEP is sent")
      ->group("");
  app.add_option("--partial-commit-at", o.partial_commit_at,
                 "testing: at step STEP's commit, tell the first node only, then die")
      ->group("");
  add_tls_flags(app, o.tls);
  app.footer(
      "Exit status: 0 finished (or stopped by an operator), 1 internal error, 2 bad input (flags, job "
      "file, TLS files, a checkpoint that is not valid for --resume), 4 the reconfiguration policy stopped the job "
      "(fewer than (f+1)*n0 nodes, or a layer with no surviving holder) and it did not wait for nodes "
      "(--exit-below-minimum, no checkpoint directory, or --wait-for-nodes ran out): a checkpoint was written when "
      "possible and its resume command printed; 5 a newer coordinator adopted the job (this one was frozen or cut off "
      "and replaced): it changed nothing.");
}

}  // namespace oobleck::apps
