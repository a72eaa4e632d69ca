#pragma once
// The model the recovery tests check runs against (issue 8): jobs of oobleck-local's default model
// on chosen node counts, the reconfiguration policy exactly as the coordinator runs it, and the
// seeded chaos schedules (kills, hangs and joins; and the coordinator's own kills and hangs, issue
// 25) with the check that the policy survives every way the coordinator may see them. No process
// is started here except `oobleck-local --print-default-job` (once): the e2e suites run the jobs,
// recovery_schedule_tests checks the schedules themselves.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "apps/job_file.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::testing {

using job_keys = std::vector<std::tuple<std::string, std::string, std::string>>;

/// oobleck-local's default job file (from `oobleck-local --print-default-job` in `apps_dir`, once).
const std::string& default_job_text(const std::string& apps_dir);

/// The default job with `section.key = value` set (replaced where the default sets it).
std::string job_with(const std::string& apps_dir, const job_keys& keys);

/// A job of the default model on `nodes` nodes with f and the slot memory given (the memory only
/// steers the planner: n0 and the templates).
struct job_case {
  std::string text;          ///< the job file; its [profile] file is "profile.json", beside it
  apps::job_file job;
  int nodes = 0;
  std::string profile_json;  ///< the modelled profile of its model (planner_model's), as JSON
};

/// A job of the default model on `nodes` nodes with f, the slot memory and `more` keys given. It
/// plans from the modelled profile (a file written beside it, see write_job), not from one measured
/// at its start, so that planner_model predicts every decision the coordinator makes.
job_case make_job(const std::string& apps_dir, int nodes, int f, std::int64_t memory, const job_keys& more = {});

/// Writes the job as `dir`/job.toml and its profile as `dir`/profile.json; returns the job file's path.
std::string write_job(const job_case& c, const std::filesystem::path& dir);

/// The policy exactly as the coordinator runs it: the same profile, job and templates.
class planner_model {
 public:
  explicit planner_model(const job_case& c) {
    profile_ = apps::modelled_profile(c.job);
    job_ = apps::planner_job(c.job, c.nodes, c.job.cluster.fault_tolerance);
    plan_ = planning::plan_job(profile_, job_);
    costs_.emplace(profile_, planning::job_memory(profile_, job_));
  }
  /// The first epoch's configuration (node ids are registration order, 0..N-1).
  planning::cluster_state initial() const { return {plan_.pipelines, plan_.idle_nodes}; }
  int n0() const { return plan_.spec.n0; }
  planning::reconfiguration lose(const planning::cluster_state& from, const std::vector<int>& lost,
                                 const std::vector<int>& joined = {}) const {
    const planning::reconfiguration_context ctx{plan_.templates, *costs_, job_.fault_tolerance,
                                                job_.global_batch / job_.microbatch, job_.microbatch};
    // The chaos schedules number nodes as the workers do.
    return planning::reconfigure(ctx, from, planning::node_ids(lost), planning::node_ids(joined));
  }
  static planning::cluster_state after(const planning::reconfiguration& r) { return {r.pipelines, r.idle_nodes}; }

 private:
  planning::profile profile_;
  planning::job_config job_;
  planning::job_plan plan_;
  std::optional<planning::layer_costs> costs_;
};

bool continues(const planning::reconfiguration& r);
/// Which pipeline of `s` runs `node` (-1: none).
int pipeline_of(const planning::cluster_state& s, int node);
/// "[0 1 2 x4] [3 4 5 x4] ".
std::string describe(const planning::cluster_state& s);
/// "0,3,4".
std::string ids_list(const std::vector<int>& ids);

/// splitmix64: the same schedules on every platform (std's distributions are not portable).
struct seeded {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
};

/// The jobs chaos draws from: different shapes, so that simple, borrow and merge all occur.
struct chaos_job {
  int nodes, f;
  std::int64_t memory;
};
inline constexpr chaos_job chaos_jobs[] = {
    {6, 1, 1'500'000},  // 2 pipelines of 3
    {5, 1, 1'500'000},  // 3 + 2
    {6, 1, 1'000'000},  // 3 pipelines of 2
    {7, 1, 1'500'000},  // 3 + 2 + 2
    {8, 2, 1'500'000},  // f = 2: 4 pipelines of 2
};

/// Steps per chaos run: a step takes 0.05 to 0.1 s here and a worker started by --join-at registers
/// 1 to 3 s after its step (sooner when a hang holds the job for the heartbeat timeout), so the
/// joined nodes usually enter while faults are still due.
inline constexpr int chaos_steps = 32;

/// Heartbeats for chaos: a hang is detected after connection_timeout_ms (5 s each), long enough
/// that 6 to 10 workers sharing 2 loaded cores (CI runs two e2e tests at once) never miss one
/// (the default 1.5 s has a third of the margin). Step deadlines short enough that a stall costs
/// seconds, not the default minutes, and long enough for a healthy step on loaded cores (~0.1 s).
inline const job_keys chaos_heartbeats{{"cluster", "heartbeat_interval_ms", "500"},
                                       {"cluster", "connection_timeout_ms", "5000"},
                                       {"faults", "step_deadline_min_ms", "2000"},
                                       {"faults", "first_step_deadline_ms", "8000"},
                                       {"faults", "form_deadline_ms", "8000"}};

/// A coordinator hang in chaos: longer than chaos_heartbeats' connection timeout (5 s), so that
/// every worker loses the coordinator and it adopts them back when it wakes (a shorter freeze
/// would only delay the job).
inline constexpr int chaos_coordinator_hang_s = 7;

/// A coordinator kill: in the middle of `step`, or right after it decided `step`'s commit and told
/// one node only (`after_commit`).
struct coordinator_kill {
  int step = 0;
  bool after_commit = false;
};

struct chaos_schedule {
  chaos_job shape;
  std::map<int, std::vector<int>> kills;  ///< step -> nodes that kill themselves (SIGKILL) in its middle
  std::map<int, std::vector<int>> hangs;  ///< step -> nodes that freeze (SIGSTOP) in its middle
  /// step -> nodes whose stage throws in every attempt of it (evicted after 3)
  std::map<int, std::vector<int>> errors;
  /// step -> nodes whose stage busy-loops in every attempt of it (named by the deadline, evicted after 2)
  std::map<int, std::vector<int>> stalls;
  /// step -> nodes whose stage throws once in it (not lost: the step runs again)
  std::map<int, std::vector<int>> blips;
  int join_step = -1;                     ///< --join-at join_step:join_count (none: -1)
  int join_count = 0;
  /// The coordinator's own faults (oobleck-local restarts a killed one at the same address): the
  /// Nth kill goes to the Nth coordinator; a hang (chaos_coordinator_hang_s) is the only one.
  std::vector<coordinator_kill> coordinator_kills;
  int coordinator_hang_step = -1;  ///< none: -1
  std::string text;

  /// The coordinator faults, each ending in an adoption (a coordinator_restored record).
  int coordinator_faults() const { return static_cast<int>(coordinator_kills.size()) + (coordinator_hang_step >= 0); }
  /// Steps whose metrics record and step_committed event died with the coordinator: killed right
  /// after deciding the commit, before writing either (its replacement completes the commit on
  /// every node but does not write the step again).
  std::set<int> records_lost() const {
    std::set<int> out;
    for (const auto& k : coordinator_kills)
      if (k.after_commit) out.insert(k.step);
    return out;
  }

  /// Every node lost in a step: killed, frozen or evicted (errors, stalls).
  std::map<int, std::vector<int>> faults() const {
    auto all = kills;
    for (const auto* m : {&hangs, &errors, &stalls})
      for (const auto& [step, ids] : *m) all[step].insert(all[step].end(), ids.begin(), ids.end());
    return all;
  }
  std::vector<std::string> args() const {
    std::vector<std::string> out;
    for (const auto& [flag, m] : {std::pair{"--fail-at", &kills}, std::pair{"--hang-at", &hangs},
                                  std::pair{"--error-at", &errors}, std::pair{"--stall-at", &stalls}})
      for (const auto& [step, ids] : *m) {
        out.push_back(flag);
        out.push_back(std::to_string(step) + ":" + ids_list(ids));
      }
    for (const auto& [step, ids] : blips) {
      out.push_back("--error-at");
      out.push_back(std::to_string(step) + ":" + ids_list(ids) + "/1");
    }
    if (join_count > 0) {
      out.push_back("--join-at");
      out.push_back(std::to_string(join_step) + ":" + std::to_string(join_count));
    }
    for (const auto& k : coordinator_kills) {
      out.push_back("--kill-coordinator-at");
      out.push_back(std::to_string(k.step) + (k.after_commit ? ":commit" : ""));
    }
    if (coordinator_hang_step >= 0) {
      out.push_back("--hang-coordinator-at");
      out.push_back(std::to_string(coordinator_hang_step) + ":" + std::to_string(chaos_coordinator_hang_s));
    }
    return out;
  }
};

/// Whether every way the coordinator may see the schedule keeps training. A step's victims are
/// lost together (a second loss arrives while the epoch forms) or one after the other (the second
/// victim's fault fires in the re-run of the step), in any order; each victim runs a stage when its
/// fault is due (otherwise it would never fire). Joined nodes (ids N, N+1, ... in registration
/// order) start after step `join_step` commits, so they may enter at any step boundary after it,
/// a few at a time, or with any loss after it (one reconfiguration whose lost and joined are both set),
/// or never (the run ends first); every such interleaving must continue too.
bool survivable(const planner_model& planner, int nodes, const std::map<int, std::vector<int>>& faults, int join_step,
                int join_count);

/// The chaos schedule of `seed`: the same on every platform, survivable by construction.
chaos_schedule draw_schedule(const std::string& apps_dir, std::uint64_t seed);

}  // namespace oobleck::testing
