#include "apps/local_setup.hpp"

#include <fstream>

#include "apps/checkpoint_job.hpp"
#include "apps/tls.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

namespace {

std::filesystem::path own_directory() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

}  // namespace

local_setup prepare_local_run(const local_options& o, const std::filesystem::path& dir) {
  local_setup s;
  s.job_path = o.config;
  if (o.config.empty()) {
    s.job_path = (dir / "job.toml").string();
    std::ofstream(s.job_path) << default_local_job;
  }
  if (!o.device.empty()) {
    // --device: the job's text with cluster.device set (its relative paths made absolute), in the
    // scratch directory; the coordinator runs that job.
    const std::string on_device = (dir / "job-on-device.toml").string();
    std::ofstream(on_device) << job_text_on_device(read_job_text(s.job_path), s.job_path, o.device);
    s.job_path = on_device;
  }
  s.job = read_job_file(s.job_path);  // a bad job file is refused here, before any process starts
  check_device_built(s.job);
  // TLS: checked here, then handed on as flags (files made absolute; a passphrase through a file of
  // the scratch directory, which only this user can read).
  s.tls = resolve_tls(s.job.tls, o.tls);
  const std::string passphrase_file = (dir / "tls-passphrase").string();
  if (!s.tls.passphrase.empty()) {
    std::ofstream(passphrase_file) << s.tls.passphrase << "\n";
    std::filesystem::permissions(passphrase_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  s.tls_forward = tls_args(s.tls, passphrase_file);
  if (!o.trace_path.empty())
    s.replay = std::make_unique<trace_replayer>(o.trace_path, o.trace_nodes.value_or(o.nodes.value_or(s.job.cluster.nodes)),
                                                o.time_scale);
  // With a trace, its starting nodes are the workers, and the trace's end (not a step count)
  // ends the run unless --steps says otherwise.
  s.nodes = s.replay ? static_cast<int>(s.replay->schedule().initial.size()) : o.nodes.value_or(s.job.cluster.nodes);
  s.steps = o.steps.value_or(s.replay ? std::int64_t{1} << 40 : static_cast<std::int64_t>(s.job.training.steps));
  s.fault_tolerance = o.fault_tolerance.value_or(s.job.cluster.fault_tolerance);
  for (const auto& f : o.faults)
    if (f.node >= s.nodes)
      throw messages::input_error("node " + std::to_string(f.node) + " does not exist: the job's nodes are 0.." +
                                  std::to_string(s.nodes - 1));
  if (!o.metrics_out.empty()) std::ofstream(o.metrics_out, std::ios::trunc);  // fresh file per run
  // The events file: the user's (fresh per run, like the metrics) or one of the scratch directory.
  s.events_path =
      o.events_out.empty() ? (dir / "events.jsonl").string() : std::filesystem::absolute(o.events_out).string();
  if (!std::ofstream(s.events_path, std::ios::trunc))
    throw messages::input_error("--events-out: cannot write " + s.events_path);
  s.address_file = dir / "coordinator.address";
  s.token = (dir / "token").string();
  s.bin = own_directory();
  return s;
}

std::vector<std::string> local_coordinator_args(const local_options& o, const local_setup& s,
                                                const std::vector<std::string>& args, const std::filesystem::path& dir) {
  std::vector<std::string> a{"--listen", "127.0.0.1:0", "--config", s.job_path, "--token-file", s.token,
                             "--nodes", std::to_string(s.nodes), "--steps", std::to_string(s.steps),
                             "--fault-tolerance", std::to_string(s.fault_tolerance),
                             "--events-out", s.events_path, "--address-file", s.address_file.string()};
  if (!o.metrics_out.empty()) a.insert(a.end(), {"--metrics-out", o.metrics_out});
  // Checkpoints: paths made absolute (the coordinator and workers share this filesystem); a stop
  // by the policy prints this program's own command to resume.
  if (!o.checkpoint_dir.empty())
    a.insert(a.end(), {"--checkpoint-dir", std::filesystem::absolute(o.checkpoint_dir).string()});
  if (o.checkpoint_every) a.insert(a.end(), {"--checkpoint-every", std::to_string(*o.checkpoint_every)});
  if (!o.resume.empty()) a.insert(a.end(), {"--resume", std::filesystem::absolute(o.resume).string()});
  a.insert(a.end(), {"--resume-command", local_resume_prefix(args)});
  a.insert(a.end(), {"--coordinator-grace", std::to_string(o.coordinator_grace_s)});
  if (o.digest_every) a.insert(a.end(), {"--digest-every", std::to_string(*o.digest_every)});
  if (!o.profile.empty())
    a.insert(a.end(), {"--profile", std::filesystem::absolute(o.profile).string()});
  else if (s.job.profile.file.empty() && s.job.profile.cache.empty() && o.checkpoint_dir.empty() &&
           s.job.checkpoint.dir.empty())
    // A profile measured at the job's start is kept for the run's replacement coordinators (this
    // program restarts a coordinator that dies), which would otherwise plan from the modelled one.
    a.insert(a.end(), {"--profile-cache", dir.string()});
  // Below the minimum: a trace replay always waits for its nodes to come back (as the simulator's
  // Oobleck does); otherwise as the flags say (the coordinator waits when it has a checkpoint directory).
  if (o.exit_below_minimum) a.push_back("--exit-below-minimum");
  else if (o.wait_for_nodes_s || s.replay)
    a.insert(a.end(), {"--wait-for-nodes", std::to_string(o.wait_for_nodes_s.value_or(0))});
  a.insert(a.end(), s.tls_forward.begin(), s.tls_forward.end());
  return a;
}

}  // namespace oobleck::apps
