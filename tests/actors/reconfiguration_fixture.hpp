#pragma once
// The fixture of the reconfiguration protocol tests (reconfiguration_*_test.cpp), on CAF's
// deterministic scheduler (the style of step_protocol_test.cpp): the real coordinator, pipeline and
// monitor actors, fake stages that can hold a step, a commit, a checkpoint write or the forming of
// an epoch, and node losses at chosen points. Each decision is compared with planning::reconfigure
// on the coordinator's own profile: which rules applied, from which configuration (the last one
// that formed), which pipelines ran, which copies each node was told to make.

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
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/coordinator.hpp"
#include "actors/monitor.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::testing {

/// What one fake stage saw, in order, and how it misbehaves.
struct fake_stage_record {
  std::int64_t node = -1;
  std::map<std::uint64_t, messages::epoch_assignment> assignments;  ///< by epoch
  std::vector<std::string> trace;  ///< "assign E", "step E K", "commit E K", "abort E", in order
  std::vector<messages::stage_step> steps;
  std::vector<messages::commit_step> commits;
  std::set<std::uint64_t> hold_form;                          ///< never answer these epochs' assignments
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_step;    ///< (epoch, step): never answer
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_commit;  ///< (epoch, step): never answer
  std::uint64_t current_epoch = 0;
  std::vector<messages::write_checkpoint> writes;
  std::set<std::int32_t> not_held;  ///< layers it answers "missing" for in checkpoint writes
  bool hold_write = false;          ///< never answer a checkpoint write

  bool traced(const std::string& what) const;
  /// Where `what` first stands in the trace (its size when it is not there).
  std::size_t position(const std::string& what) const;
  /// How many commits of `step` it received.
  std::size_t commits_of(std::uint64_t step) const;
  /// How many times it ran `step` (in `epoch`, if given).
  std::size_t runs_of(std::uint64_t step, std::optional<std::uint64_t> epoch = std::nullopt) const;
};

/// Six workers with fake stages; the profile makes n0 = 2 and the first plan two pipelines of
/// three nodes, [0 1 2] and [3 4 5], 4 microbatches each.
struct fixture {
  using setup_map = std::map<std::int64_t, std::function<void(fake_stage_record&)>>;

  struct config : caf::actor_system_config {
    config();
  };
  config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys};
  std::vector<std::string> log;
  std::vector<actors::step_record> records;
  std::vector<actors::reconfiguration_record> recoveries;
  messages::coordinator_actor coord;
  std::map<std::int64_t, std::unique_ptr<fake_stage_record>> stages;  // by node id; outlive the actors
  std::map<std::int64_t, messages::monitor_actor> monitors;              // by node id
  std::map<std::int64_t, messages::stage_actor> stage_actors;
  std::vector<messages::monitor_actor> all_monitors;
  planning::profile profile;
  planning::job_config job;
  planning::job_plan plan;
  // checkpoints (when the fixture is made with a checkpoint root)
  std::vector<std::pair<std::uint64_t, std::vector<messages::checkpoint_layer_file>>> finished;  ///< step, files
  std::vector<std::string> discarded;
  std::vector<actors::checkpoint_stop_record> stops;

  static constexpr int nodes = 6;

  explicit fixture(std::uint64_t steps, std::uint64_t checkpoint_every = 0, bool checkpoints = false);
  ~fixture();

  /// Starts the six workers; `setup[id]` adjusts node id's fake before the job starts. Node ids
  /// are registration order, which on this scheduler is the order of the workers' spawns.
  void start(const setup_map& setup = {});
  /// Spawns worker `i` (named "w<i>"): its monitor registers with the coordinator once the
  /// scheduler runs. Workers after the first `nodes` join a job that trains.
  void add_worker(int i, const setup_map& setup = {});
  /// The node's process dies: its monitor and its stage.
  void kill(std::int64_t node);
  /// Starts the job (`setup` as for start()) with `node` never answering its commit of
  /// (epoch, step), and kills that node once the coordinator is committing that step.
  void kill_during_commit(std::int64_t node, std::pair<std::uint64_t, std::uint64_t> commit, setup_map setup = {});
  /// The coordinator's answer to an operator's status request.
  messages::job_status status();

  bool logged(const std::string& text) const;
  std::size_t log_position(const std::string& text) const;

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
};

inline std::string rules_of(const planning::reconfiguration& r) { return r.reason; }

/// The second victim for "lost while forming": a node the first reconfiguration copies from
/// (in another pipeline than `first` where one exists) whose loss together with `first` the
/// policy survives.
int copy_source_to_lose(const fixture& f, int first);

}  // namespace oobleck::testing
