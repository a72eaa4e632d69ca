#pragma once
// The one fixture of the deterministic protocol tests (coordinator_test.cpp, step_protocol_test.cpp,
// reconfiguration_*_test.cpp), on CAF's deterministic scheduler: the real coordinator, pipeline and
// monitor actors; fake stages (one actor per slot) that record what they were sent and can hold a
// step, a commit, a checkpoint write or the forming of an epoch, or fail a step; node losses at
// chosen points. What the job did is read from the coordinator's typed events (`events`, collected
// through coordinator_deps::on_event) and its records (steps, reconfigurations, checkpoints), never
// from its log lines: those are kept (with OOBLECK_LOG_PREFIX before each, as the programs print
// them) only for the few checks of what a user is told on purpose (`told`).
//
// Decisions can be compared with planning::reconfigure on the coordinator's own profile: which rules
// applied, from which configuration, which pipelines ran, which copies each node was told to make.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <initializer_list>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/coordinator.hpp"
#include "actors/monitor.hpp"
#include "messages/protocol.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "support/job_events.hpp"

namespace oobleck::testing {

using planning::node_ids;

/// What one fake stage (one slot of a node) saw, in order, and how it misbehaves.
struct fake_stage_record {
  std::int64_t node = -1;
  int slot = 0;
  fake_stage_record* first = nullptr;  ///< slot 0's record (the node's); null for slot 0 itself
  std::vector<std::unique_ptr<fake_stage_record>> runners;  ///< slot 0: the records of slots 1, 2, ...
  std::map<std::uint64_t, messages::epoch_assignment> assignments;  ///< slot 0: by epoch
  std::vector<std::string> trace;  ///< "assign E", "step E K", "commit E K", "abort E", "write K", in order
  std::vector<messages::stage_step> steps;
  std::vector<messages::commit_step> commits;
  std::vector<messages::write_checkpoint> writes;
  /// What the node kept (slot 0's record), as a worker's memory reports it to a replacement
  /// coordinator: commits applied (one update of every layer each), the step of the last applied
  /// one, and the last step whose gradients it finished.
  std::int64_t applied = 0;
  std::int64_t last_applied_step = -1;
  std::int64_t last_done_step = -1;

  std::set<std::uint64_t> hold_form;                                   ///< never answer these epochs' assignments
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_step;    ///< (epoch, step): never answer
  std::set<std::pair<std::uint64_t, std::uint64_t>> hold_steps;        ///< more (epoch, step)s never answered
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_commit;  ///< (epoch, step): never answer
  std::optional<std::uint64_t> fail_step;  ///< answer this step with a stage error, in every epoch
  int fail_evals = 0;                      ///< answer this many evaluation rounds with a stage error
  /// Commits report the tied matrix's digest for layer 0 and the last layer it holds (always 7;
  /// 8 when this is set: the copies disagree).
  bool bad_tied_digest = false;
  std::set<std::int32_t> not_held;         ///< layers it answers "missing" for in checkpoint writes
  bool hold_write = false;                 ///< never answer a checkpoint write
  /// What its node tells the stall probe (slot 0's): a stage computing this long now, forming blocked.
  double computing_ms = 0;
  bool forming_blocked = false;
  std::string write_error;                 ///< answer checkpoint writes with this error, writing nothing

  /// The node's newest assignment (an empty one before any).
  const messages::epoch_assignment& assignment() const;
  /// The epochs the node was assigned, in order (slots other than 0 get none: slot 0 forms the node).
  std::vector<std::uint64_t> epochs() const;
  /// The epochs whose data plane the node was told to abort, in order.
  std::vector<std::uint64_t> aborted() const;
  bool traced(const std::string& what) const;
  /// Where `what` first stands in the trace (its size when it is not there).
  std::size_t position(const std::string& what) const;
  /// How many commits of `step` it received.
  std::size_t commits_of(std::uint64_t step) const;
  /// How many times it ran `step` (in `epoch`, if given).
  std::size_t runs_of(std::uint64_t step, std::optional<std::uint64_t> epoch = std::nullopt) const;
};

struct fixture {
  using setup_map = std::map<std::int64_t, std::function<void(fake_stage_record&)>>;

  /// The job. The defaults are the reconfiguration tests' job: six nodes, a synthetic 6-layer GPT
  /// whose slot memory makes n0 = 2, so the first plan is two pipelines of three nodes, [0 1 2] and
  /// [3 4 5], 4 microbatches each.
  struct options {
    int nodes = 6;  ///< the job waits for this many nodes
    std::uint64_t steps = 0;  ///< 0: admission only
    int slots = 1;  ///< slots per node; above 1 a wide stage is so slow that nodes run one stage per slot
    std::int64_t device_memory_bytes = 800'000;
    double device_tflops = 0.02;
    std::int32_t global_batch = 16;  ///< microbatches of 2 samples
    std::uint64_t checkpoint_every = 0;
    bool checkpoints = false;  ///< checkpoints to "/ckpt" (also when checkpoint_every > 0)
    double clip_norm = 0;                 ///< coordinator_deps::clip_norm
    std::uint64_t eval_every = 0;         ///< coordinator_deps::eval_every
    std::int32_t eval_windows = 0;        ///< coordinator_deps::eval_windows
    bool wait_below_minimum = false;      ///< coordinator_deps::wait_below_minimum
    double wait_for_nodes_ms = 0;         ///< coordinator_deps::wait_for_nodes_ms
    std::uint64_t digest_every = 1;       ///< coordinator_deps::faults.digest_every
    /// coordinator_deps::profile_at_start: a node measures the model (its monitor's profile_job
    /// answers `measured`, or throws when the worker's profile_fails) before the first plan.
    bool profile_at_start = false;
    bool run_ahead = true;  ///< coordinator_deps::run_ahead (on, as in the programs)
    std::function<std::vector<std::uint8_t>()> new_nccl_id;  ///< coordinator_deps::new_nccl_id (unset: host transport)
    bool one_gpu_per_worker = false;  ///< admission_policy::one_gpu_per_worker
  };
  /// The step protocol tests' jobs: `nodes` nodes of `slots` slots, any of which holds the whole
  /// model, a global batch of 8 (4 microbatches).
  static options roomy(int nodes, std::uint64_t steps, int slots = 1);

  /// A worker: its monitor and what it saw.
  struct worker_options {
    std::string name;
    std::function<void(fake_stage_record&)> setup;  ///< adjusts each of its fake stages (node id set) before they run
    int slots = 1;
    std::int32_t device_index = 0;     ///< monitor_deps::device_index
    std::string data_host = "127.0.0.1";  ///< where its data plane listens (its host, to the coordinator)
    std::optional<std::string> token;  ///< default: the job's
    std::string job_hash;              ///< of the worker's own job file; empty: any job
    bool stages = true;                ///< false: the node cannot run stages (admission tests)
    bool profile_fails = false;        ///< its profile_job throws (options::profile_at_start)
    /// Where it registers first (default: the fixture's coordinator).
    std::optional<messages::coordinator_actor> first_coordinator;
    /// It looks for a coordinator when it loses one (monitor_deps::find_coordinator): it finds
    /// the fixture's; grace_s as given.
    bool finds_coordinator = false;
    double grace_s = 5;
    /// monitor_deps::drop_coordinator_link (unset: none).
    std::function<std::size_t()> drop_link;
  };
  struct worker {
    std::string name;
    messages::monitor_actor handle;
    std::int64_t node = -1;
    std::vector<std::string> trace;  ///< "admitted N", "fault KIND at STEP", in order
    std::vector<messages::inject_fault> faults;  ///< recorded, never carried out
    std::vector<std::string> log;    ///< its monitor's lines (what the worker tells its user)
    /// Its log so far, a line each.
    [[nodiscard]] std::string said() const {
      std::string all;
      for (const auto& line : log) all += line + "\n";
      return all;
    }
  };

  struct config : caf::actor_system_config {
    config();
  };
  config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys};
  options opts;
  std::vector<messages::job_event> events;  ///< what the coordinator published, in order
  std::vector<std::string> log;             ///< every progress line, "[coordinator] ..." or "[NAME] ...", prefixed
  std::vector<actors::step_record> records;
  std::vector<actors::reconfiguration_record> recoveries;
  std::vector<actors::eval_record> evals;
  messages::coordinator_actor coord;
  std::map<std::int64_t, std::unique_ptr<fake_stage_record>> stages;  ///< slot 0 by node id; outlive the actors
  std::map<std::int64_t, messages::monitor_actor> monitors;           ///< by node id
  std::map<std::int64_t, std::vector<messages::stage_actor>> stage_actors;  ///< by node id, per slot
  std::vector<std::unique_ptr<worker>> workers;  ///< in spawn order; outlive the actors
  planning::profile profile;
  /// What a node measures when the job profiles at its start (options::profile_at_start): the
  /// modelled `profile` by default; a test changes it before the workers are added.
  planning::profile measured;
  std::vector<planning::profile> profiled;  ///< coordinator_deps::on_profiled, in order
  std::vector<std::string> profiled_by;     ///< the workers whose profile_job ran, in order
  planning::job_config job;
  planning::job_plan plan;  ///< the first plan on `nodes` nodes (when the job trains)
  // checkpoints
  std::vector<std::pair<std::uint64_t, std::vector<messages::checkpoint_layer_file>>> finished;  ///< step, files
  std::vector<std::string> discarded;
  std::vector<actors::checkpoint_stop_record> stops;
  std::vector<actors::waiting_record> waits;     ///< coordinator_deps::on_waiting, in order
  std::vector<actors::resumed_record> resumes;   ///< coordinator_deps::on_resumed, in order
  std::vector<actors::restore_record> restores;  ///< coordinator_deps::on_restored, in order

  static constexpr int nodes = 6;  ///< of the default job
  static const std::string token;

  explicit fixture(options o);
  ~fixture();
  fixture(const fixture&) = delete;
  fixture& operator=(const fixture&) = delete;

  /// Starts the job's `nodes` workers ("w0", "w1", ...); `setup[id]` adjusts node id's fakes before
  /// the job starts. Node ids are registration order, which on this scheduler is the spawn order.
  void start(const setup_map& setup = {});
  /// Spawns worker "w<i>" of the job's slots (setup by node id, as for start()); it registers once
  /// the scheduler runs.
  /// Workers after the first `nodes` join a job that trains.
  void add_worker(int i, const setup_map& setup = {});
  /// Spawns a worker; it registers once the scheduler runs.
  worker& add_worker(worker_options o);
  /// The node's process dies: its monitor and its stages.
  void kill(std::int64_t node);
  /// The coordinator's process dies (kill) and a replacement starts with the same dependencies and
  /// the next term (ARCHITECTURE.md §10 "Coordinator loss"): workers that look for a coordinator
  /// (worker_options::finds_coordinator) find it and come back with their state. Its events and
  /// records join the first one's.
  void replace_coordinator();
  /// Starts the job (`setup` as for start()) with `node` never answering its commit of
  /// (epoch, step), and kills that node once the coordinator is committing that step.
  void kill_during_commit(std::int64_t node, std::pair<std::uint64_t, std::uint64_t> commit, setup_map setup = {});

  /// Sends a request to the coordinator, runs the scheduler, stores the reply in `out`; returns "ok"
  /// or the error's description ("no reply" when none came).
  template <class Reply, class... Ts>
  std::string ask(Reply& out, Ts&&... xs) {
    auto response = self->request(coord, caf::infinite, std::forward<Ts>(xs)...);
    sched.run();
    std::string result = "no reply";
    response.receive(
        [&](Reply& r) {
          out = std::move(r);
          result = "ok";
        },
        [&](caf::error& e) { result = messages::describe(e); });
    return result;
  }
  /// A fresh operator proof (a nonce asked for, then the job token's proof over it).
  messages::control_proof operator_proof();
  /// The coordinator's answer to an operator's status request.
  messages::job_status status();
  /// Whether `m` is still running (after the scheduler ran).
  bool alive(const messages::monitor_actor& m);

  /// Whether an event matching `m` was published.
  bool happened(const event_match& m) const { return contains(events, m); }
  /// Where the first event matching `m` stands among the events (their count when none does).
  std::size_t position(const event_match& m, std::size_t from = 0) const { return testing::position(events, m, from); }
  /// The job's stopped event (exactly one; fails the test otherwise).
  const messages::job_event& stop() const;
  /// Whether some progress line contains `text`: only for checks of what a user is told on purpose
  /// (the resume command, why no checkpoint was written), never for what happened.
  bool told(const std::string& text) const;

  // The policy, as the coordinator runs it.
  planning::cluster_state initial() const { return {plan.pipelines, plan.idle_nodes}; }
  planning::reconfiguration lose(const planning::cluster_state& from, std::vector<int> lost,
                                 std::vector<int> joined = {}) const;
  static planning::cluster_state after(const planning::reconfiguration& r) { return {r.pipelines, r.idle_nodes}; }

  /// The copy plan of `epoch` as (layer, from node, to node), read from the assignments the
  /// live nodes received (ranks mapped back to node ids).
  std::set<std::tuple<int, int, int>> copies_of(std::uint64_t epoch) const;
  static std::set<std::tuple<int, int, int>> copies_of(const planning::reconfiguration& r);
  /// Whether the committed steps from `first` on ran on exactly `expected`'s pipelines.
  void check_pipelines(std::size_t first, const planning::cluster_state& expected) const;
  /// Every committed step once, in order, B samples, every layer's holders in agreement.
  void check_steps(std::uint64_t steps) const;

 private:
  std::string prefix_;  ///< OOBLECK_LOG_PREFIX
  actors::coordinator_deps deps_;  ///< what the coordinator was spawned with (for a replacement)
};

inline std::string rules_of(const planning::reconfiguration& r) { return r.reason; }

/// The epoch_forming event of a reconfiguration after losing `lost` (and admitting `joined`), with
/// the policy's `rules` (any, if not given).
event_match reconfigured(std::vector<std::int64_t> lost, std::vector<std::int64_t> joined = {},
                         std::optional<std::string> rules = std::nullopt);

/// The second victim for "lost while forming": a node the first reconfiguration copies from
/// (in another pipeline than `first` where one exists) whose loss together with `first` the
/// policy survives.
int copy_source_to_lose(const fixture& f, int first);

}  // namespace oobleck::testing
