// The reconfiguration state machine on CAF's deterministic scheduler (the style of
// step_protocol_test.cpp): the real coordinator, pipeline and monitor actors, fake stages that can
// hold a step, a commit or the forming of an epoch, and node losses at chosen points: while a
// reconfiguration forms (before every node_ready), two in a row, during a commit. Each decision is
// compared with planning::reconfigure on the coordinator's own profile: which rules applied,
// from which configuration (the last one that formed), which pipelines ran, which copies each
// node was told to make.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/coordinator.hpp"
#include "actors/monitor.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "planning/synthetic_profile.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;
namespace planning = oobleck::planning;

namespace {

const std::string token(64, 'k');

/// What one fake stage saw, in order, and how it misbehaves.
struct fake_stage_record {
  std::int64_t node = -1;
  std::map<std::uint64_t, epoch_assignment> assignments;  ///< by epoch
  std::vector<std::string> trace;  ///< "assign E", "step E K", "commit E K", "abort E", in order
  std::vector<stage_step> steps;
  std::vector<commit_step> commits;
  std::set<std::uint64_t> hold_form;                          ///< never answer these epochs' assignments
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_step;    ///< (epoch, step): never answer
  std::optional<std::pair<std::uint64_t, std::uint64_t>> hold_commit;  ///< (epoch, step): never answer
  std::uint64_t current_epoch = 0;
  std::vector<write_checkpoint> writes;
  std::set<std::int32_t> not_held;  ///< layers it answers "missing" for in checkpoint writes
  bool hold_write = false;          ///< never answer a checkpoint write

  bool traced(const std::string& what) const { return std::find(trace.begin(), trace.end(), what) != trace.end(); }
  std::size_t position(const std::string& what) const {
    return static_cast<std::size_t>(std::find(trace.begin(), trace.end(), what) - trace.begin());
  }
};

stage_actor::behavior_type fake_stage(stage_actor::pointer self, fake_stage_record* rec) {
  return {
      [self, rec](epoch_assignment& a) -> caf::result<form_timing> {
        rec->trace.push_back("assign " + std::to_string(a.epoch));
        rec->assignments[a.epoch] = a;
        rec->current_epoch = a.epoch;
        if (rec->hold_form.count(a.epoch)) return self->make_response_promise<form_timing>();
        // Copies that take longer on higher ranks: the record keeps the slowest node's.
        return form_timing{1000, 100 + 1000 * std::max(0, a.rank), 500, 0, a.copies.empty() ? 0 : 1'000'000,
                           200 + std::max(0, a.rank), 50 + 10 * std::max(0, a.rank)};
      },
      [self, rec](stage_step& s) -> caf::result<stage_done> {
        rec->trace.push_back("step " + std::to_string(s.epoch) + " " + std::to_string(s.step));
        rec->steps.push_back(s);
        const auto& st = rec->assignments.at(s.epoch).stages.at(0);
        if (rec->hold_step == std::pair{s.epoch, s.step}) return self->make_response_promise<stage_done>();
        stage_done d{s.epoch, s.step, st.pipeline, st.stage, 0, {}};
        if (st.stage + 1 == st.num_stages) d.loss_sum = 2.0 * s.microbatches;
        return d;
      },
      [self, rec](commit_step& c) -> caf::result<step_committed> {
        rec->trace.push_back("commit " + std::to_string(c.epoch) + " " + std::to_string(c.step));
        rec->commits.push_back(c);
        if (rec->hold_commit == std::pair{c.epoch, c.step}) return self->make_response_promise<step_committed>();
        step_committed out{c.epoch, c.step, -1, {}};
        const auto& a = rec->assignments.at(c.epoch);
        if (a.stages.empty()) return out;
        const auto& st = a.stages.at(0);
        for (int l = st.first_layer; l < st.end_layer; ++l) out.digests.push_back({l, 1000u + static_cast<unsigned>(c.step)});
        return out;
      },
      [self, rec](write_checkpoint& w) -> caf::result<checkpoint_written> {
        rec->trace.push_back("write " + std::to_string(w.step));
        rec->writes.push_back(w);
        if (rec->hold_write) return self->make_response_promise<checkpoint_written>();
        checkpoint_written out{w.request, -1, {}, {}, {}};
        for (auto l : w.layers) {
          if (rec->not_held.count(l))
            out.missing.push_back(l);
          else
            out.files.push_back({l, 100u + static_cast<std::uint64_t>(l), "sha-" + std::to_string(l)});
        }
        return out;
      },
  };
}

/// Six workers with fake stages; the profile makes n0 = 2 and the first plan two pipelines of
/// three nodes, [0 1 2] and [3 4 5], 4 microbatches each.
struct fixture {
  struct config : caf::actor_system_config {
    config() {
      add_protocol_types(*this);
      set("scheduler.policy", caf::atom("testing"));
    }
  };
  config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys};
  std::vector<std::string> log;
  std::vector<step_record> records;
  std::vector<reconfiguration_record> recoveries;
  coordinator_actor coord;
  std::map<std::int64_t, std::unique_ptr<fake_stage_record>> stages;  // by node id; outlive the actors
  std::map<std::int64_t, monitor_actor> monitors;                      // by node id
  std::map<std::int64_t, stage_actor> stage_actors;
  std::vector<monitor_actor> all_monitors;
  std::map<std::string, std::function<void(fake_stage_record&)>> setups;  // by worker name
  planning::profile profile;
  planning::job_config job;
  planning::job_plan plan;
  // checkpoints (when the fixture is made with a checkpoint root)
  std::vector<std::pair<std::uint64_t, std::vector<checkpoint_layer_file>>> finished;  ///< step, files
  std::vector<std::string> discarded;
  std::vector<checkpoint_stop_record> stops;

  static constexpr int nodes = 6;

  explicit fixture(std::uint64_t steps, std::uint64_t checkpoint_every = 0, bool checkpoints = false) {
    planning::synthetic_gpt g;
    g.layers = 6;
    g.hidden = 32;
    g.heads = 2;
    g.sequence = 16;
    g.vocab = 256;
    g.microbatch = 2;
    g.gpus_per_node = 1;
    g.device_tflops = 0.02;
    g.device_memory_bytes = 800'000;
    profile = planning::synthetic_gpt_profile(g);
    job.nodes = nodes;
    job.fault_tolerance = 1;
    job.global_batch = 16;
    job.microbatch = 2;
    plan = planning::plan_job(profile, job);

    coordinator_deps d;
    d.policy = {token, "hash", protocol_version};
    d.expected_nodes = nodes;
    d.log = [this](const std::string& l) { log.push_back(l); };
    d.profile = profile;
    d.job = job;
    d.steps = steps;
    d.on_step = [this](const step_record& r) { records.push_back(r); };
    d.on_reconfigured = [this](const reconfiguration_record& r) { recoveries.push_back(r); };
    if (checkpoints || checkpoint_every > 0) {
      d.checkpoint.root = "/ckpt";
      d.checkpoint.every = checkpoint_every;
      d.checkpoint.begin = [](std::uint64_t step) { return "/ckpt/.tmp-" + std::to_string(step); };
      d.checkpoint.finish = [this](const std::string&, std::uint64_t step, const std::vector<checkpoint_layer_file>& files) {
        finished.emplace_back(step, files);
        return "/ckpt/step-" + std::to_string(step);
      };
      d.checkpoint.discard = [this](const std::string& temp) { discarded.push_back(temp); };
      d.checkpoint.on_stop = [this](const checkpoint_stop_record& r) { stops.push_back(r); };
    }
    coord = sys.spawn(coordinator, std::move(d));
    sched.run();
  }
  ~fixture() {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    for (auto& m : all_monitors) caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
    for (auto& [id, s] : stage_actors) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Starts the six workers; `setup[id]` adjusts node id's fake before the job starts. Node ids
  /// are registration order, which on this scheduler is the order of the workers' spawns.
  void start(const std::map<std::int64_t, std::function<void(fake_stage_record&)>>& setup = {}) {
    for (int i = 0; i < nodes; ++i) add_worker(i, setup);
    sched.run();
    REQUIRE(monitors.size() == static_cast<std::size_t>(nodes));
    for (auto& [id, rec] : stages) REQUIRE(rec->node == id);
  }

  /// Spawns worker `i` (named "w<i>"): its monitor registers with the coordinator once the
  /// scheduler runs. Workers after the first `nodes` join a job that trains.
  void add_worker(int i, const std::map<std::int64_t, std::function<void(fake_stage_record&)>>& setup = {}) {
    monitor_deps d;
    d.coordinator = coord;
    d.token = token;
    d.name = "w" + std::to_string(i);
    d.data = {"127.0.0.1", static_cast<std::uint16_t>(5000 + i)};
    d.make_stage = [this, setup](const admission& a) {
      auto& rec = stages[a.node];
      rec = std::make_unique<fake_stage_record>();
      rec->node = a.node;
      if (auto it = setup.find(a.node); it != setup.end()) it->second(*rec);
      auto* r = rec.get();
      spawned_stage s;
      s.actor = sys.spawn(fake_stage, r);
      stage_actors[a.node] = s.actor;
      s.abort = [r](std::uint64_t epoch, const std::string&) { r->trace.push_back("abort " + std::to_string(epoch)); };
      return s;
    };
    d.admitted = [this, i](const admission& a) { monitors[a.node] = all_monitors.at(static_cast<std::size_t>(i)); };
    all_monitors.push_back(sys.spawn(monitor, std::move(d)));
  }

  /// The node's process dies: its monitor and its stage.
  void kill(std::int64_t node) {
    caf::anon_send_exit(monitors.at(node), caf::exit_reason::kill);
    caf::anon_send_exit(stage_actors.at(node), caf::exit_reason::kill);
  }

  job_status status() {
    std::string nonce;
    auto n = self->request(coord, caf::infinite, nonce_request{protocol_version});
    sched.run();
    n.receive([&](std::string& x) { nonce = x; }, [](caf::error& e) { FAIL(describe(e)); });
    job_status s;
    auto r = self->request(coord, caf::infinite, status_atom_v, control_proof{nonce, control_proof_of(token, nonce)});
    sched.run();
    r.receive([&](job_status& x) { s = x; }, [](caf::error& e) { FAIL(describe(e)); });
    return s;
  }

  bool logged(const std::string& text) const {
    for (const auto& l : log)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
  std::size_t log_position(const std::string& text) const {
    for (std::size_t i = 0; i < log.size(); ++i)
      if (log[i].find(text) != std::string::npos) return i;
    return log.size();
  }

  // The policy, as the coordinator runs it.
  planning::cluster_state initial() const { return {plan.pipelines, plan.idle_nodes}; }
  planning::reconfiguration lose(const planning::cluster_state& from, std::vector<int> lost,
                                 std::vector<int> joined = {}) const {
    const planning::layer_costs costs(profile, planning::job_memory(profile, job));
    const planning::reconfiguration_context ctx{plan.templates, costs, job.fault_tolerance,
                                                job.global_batch / job.microbatch, job.microbatch};
    return planning::reconfigure(ctx, from, lost, joined);
  }
  static planning::cluster_state after(const planning::reconfiguration& r) { return {r.pipelines, r.idle_nodes}; }

  /// The copy plan of `epoch` as (layer, from node, to node), read from the assignments the
  /// live nodes received (ranks mapped back to node ids).
  std::set<std::tuple<int, int, int>> copies_of(std::uint64_t epoch) const {
    std::map<int, int> node_of_rank;
    const epoch_assignment* any = nullptr;
    for (const auto& [id, rec] : stages) {
      auto it = rec->assignments.find(epoch);
      if (it == rec->assignments.end()) continue;
      any = &it->second;
      if (it->second.rank >= 0) node_of_rank[it->second.rank] = static_cast<int>(id);
    }
    std::set<std::tuple<int, int, int>> out;
    if (!any) return out;
    for (const auto& c : any->copies) out.insert({c.layer, node_of_rank.at(c.source), node_of_rank.at(c.target)});
    return out;
  }
  static std::set<std::tuple<int, int, int>> copies_of(const planning::reconfiguration& r) {
    std::set<std::tuple<int, int, int>> out;
    for (const auto& c : r.copies) out.insert({c.layer, c.from_node, c.to_node});
    return out;
  }
  /// Whether the committed steps from `first` on ran on exactly `expected`'s pipelines.
  void check_pipelines(std::size_t first, const planning::cluster_state& expected) const {
    for (std::size_t k = first; k < records.size(); ++k) {
      CAPTURE(k);
      REQUIRE(records[k].pipelines.size() == expected.pipelines.size());
      for (std::size_t i = 0; i < expected.pipelines.size(); ++i) {
        const auto& [nodes, microbatches] = records[k].pipelines[i];
        CHECK(std::vector<int>(nodes.begin(), nodes.end()) == expected.pipelines[i].nodes);
        CHECK(microbatches == expected.pipelines[i].microbatches);
      }
    }
  }
  /// Every committed step once, in order, B samples, every layer's holders in agreement.
  void check_steps(std::uint64_t steps) const {
    REQUIRE(records.size() == steps);
    for (std::size_t k = 0; k < steps; ++k) {
      CAPTURE(k);
      CHECK(records[k].step == k);
      CHECK(records[k].samples == job.global_batch);
      std::int32_t microbatches = 0;
      for (const auto& p : records[k].pipelines) microbatches += p.second;
      CHECK(microbatches * job.microbatch == job.global_batch);
      CHECK(records[k].layer_digests.size() == 6u);
      for (const auto& [layer, digests] : records[k].layer_digests) {
        CHECK(digests.size() == records[k].pipelines.size());
        for (auto d : digests) CHECK(d == 1000u + k);
      }
    }
  }
};

std::string rules_of(const planning::reconfiguration& r) { return r.reason; }

/// The second victim for "lost while forming": a node the first reconfiguration copies from
/// (in another pipeline than `first` where one exists) whose loss together with `first` the
/// policy survives.
int copy_source_to_lose(const fixture& f, int first) {
  const auto start = f.initial();
  auto pipeline_of = [&](int node) {
    for (std::size_t i = 0; i < start.pipelines.size(); ++i)
      for (int n : start.pipelines[i].nodes)
        if (n == node) return static_cast<int>(i);
    return -1;
  };
  std::optional<int> same_pipeline;
  for (const auto& c : f.lose(start, {first}).copies) {
    if (f.lose(start, {first, c.from_node}).action != planning::reconfiguration_action::continue_training) continue;
    if (pipeline_of(c.from_node) != pipeline_of(first)) return c.from_node;
    if (!same_pipeline) same_pipeline = c.from_node;
  }
  REQUIRE(same_pipeline);
  return *same_pipeline;
}

}  // namespace

TEST_CASE("reconfiguration protocol: the fixture's first plan is two pipelines of three nodes") {
  fixture f(2);
  REQUIRE(f.plan.pipelines.size() == 2);
  CHECK(f.plan.pipelines[0].nodes == std::vector<int>{0, 1, 2});
  CHECK(f.plan.pipelines[1].nodes == std::vector<int>{3, 4, 5});
  CHECK(f.plan.spec.n0 == 2);
  f.start();
  CHECK(f.logged("training finished: 2 step(s) committed"));
  f.check_steps(2);
  f.check_pipelines(0, f.initial());
  CHECK(f.recoveries.empty());
}

TEST_CASE("reconfiguration protocol: a copy source lost while the new epoch forms: planned again from the last formed epoch") {
  // Node 0 dies in the middle of step 1. Node C, a copy source of that reconfiguration, never
  // finishes forming epoch 2 (its copies hang), and then dies too. Epoch 2 must never start; the
  // coordinator plans epoch 3 from epoch 1's configuration (where the layers still are: nothing
  // of epoch 2 formed) without nodes 0 and C, and step 1 runs once, in epoch 3.
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  const int a = 0;
  const int c = copy_source_to_lose(f, a);
  CAPTURE(c);
  f.start({{a, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {c, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  REQUIRE(f.records.size() == 1);
  f.kill(a);
  f.sched.run();
  const auto first = f.lose(f.initial(), {a});
  CHECK(f.logged("reconfigured after losing node(s) " + std::to_string(a) + " (" + rules_of(first) + ", "));
  REQUIRE(f.status().state == "forming");
  CHECK(f.status().epoch == 2);
  CHECK(f.copies_of(2) == fixture::copies_of(first));
  for (const auto& [id, rec] : f.stages)
    if (id != a) CHECK(rec->traced("assign 2"));

  f.kill(c);
  f.sched.run();
  const auto both = f.lose(f.initial(), {a, c});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  CHECK(f.logged("reconfigured after losing node(s) " + std::to_string(a) + " " + std::to_string(c) + " (" +
                 rules_of(both) + ", "));
  CHECK(!f.logged("epoch 2 formed"));
  CHECK(f.logged("epoch 3 formed"));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  f.check_steps(steps);
  CHECK(f.records[0].epoch == 1);
  for (std::size_t k = 1; k < steps; ++k) CHECK(f.records[k].epoch == 3);
  f.check_pipelines(1, fixture::after(both));
  // The copies of epoch 3 come from the holders of epoch 1, not from anything epoch 2 moved.
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  for (const auto& [id, rec] : f.stages) {
    if (id == a || id == c) continue;
    CAPTURE(id);
    // Each survivor aborted epoch 1's data plane and then epoch 2's, before forming epoch 3,
    // and ran nothing in epoch 2.
    REQUIRE(rec->traced("abort 1"));
    REQUIRE(rec->traced("abort 2"));
    REQUIRE(rec->traced("assign 3"));
    CHECK(rec->position("abort 1") < rec->position("assign 2"));
    CHECK(rec->position("abort 2") < rec->position("assign 3"));
    for (const auto& s : rec->steps) CHECK(s.epoch != 2);
    int runs_of_1 = 0;
    for (const auto& s : rec->steps) runs_of_1 += s.step == 1 && s.epoch == 3;
    CHECK(runs_of_1 == (rec->assignments.at(3).stages.empty() ? 0 : 1));
  }
  // One recovery: from the last commit before the failure to the first commit after it.
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].epoch == 3);
  CHECK(f.recoveries[0].lost == std::vector<std::int64_t>{a, c});
  CHECK(f.recoveries[0].action == rules_of(first) + "," + rules_of(both));  // both decisions, in order
  CHECK(f.recoveries[0].resumed_step == 1);
  // Where forming went, from the nodes' own reports: the slowest node of epoch 3 per phase.
  int top_rank = 0;
  for (const auto& [id, rec] : f.stages)
    if (rec->assignments.count(3)) top_rank = std::max(top_rank, rec->assignments.at(3).rank);
  CHECK(f.recoveries[0].copy_ms == doctest::Approx((100 + 1000 * top_rank) / 1000.0));
  CHECK(f.recoveries[0].copy_wait_ms == doctest::Approx((50 + 10 * top_rank) / 1000.0));
  CHECK(f.recoveries[0].connect_ms == doctest::Approx(1.0));
  CHECK(f.recoveries[0].prepare_ms == doctest::Approx((200 + top_rank) / 1000.0));
  CHECK(f.recoveries[0].views_ms == doctest::Approx(0.5));
  CHECK(f.recoveries[0].form_ms >= 0);
}

TEST_CASE("reconfiguration protocol: another node lost while a slow node still forms the new epoch") {
  // Node 0 dies in step 1; node 1 never finishes forming epoch 2; node 4 (the other pipeline)
  // dies while epoch 2 forms. Epoch 3 is planned from epoch 1 without 0 and 4; node 1, which
  // never answered epoch 2, forms epoch 3 and trains.
  constexpr std::uint64_t steps = 3;
  fixture f(steps);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {1, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  f.kill(0);
  f.sched.run();
  REQUIRE(f.status().state == "forming");
  f.kill(4);
  f.sched.run();
  const auto both = f.lose(f.initial(), {0, 4});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  CHECK(f.logged("reconfigured after losing node(s) 0 4 (" + rules_of(both) + ", "));
  CHECK(!f.logged("epoch 2 formed"));
  CHECK(f.logged("training finished: 3 step(s) committed"));
  f.check_steps(steps);
  f.check_pipelines(1, fixture::after(both));
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  CHECK(!f.stages.at(1)->steps.empty());  // the slow node trains in epoch 3
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].lost == std::vector<std::int64_t>{0, 4});
}

TEST_CASE("reconfiguration protocol: a node that registers while a reconfiguration forms enters at the next step boundary") {
  // Node 0 dies in step 1; while epoch 2 (planned without it) forms, a seventh worker registers:
  // it enters at the next step boundary. Epoch 2 forms and step 1 commits: at that boundary the
  // new node must be admitted. (Was a bug: forming an epoch cleared every joining node, so a node
  // that registered while an epoch formed was never admitted and idled to the end.)
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  f.kill(0);
  // Run until the coordinator has sent epoch 2's assignments, then start the new worker: its
  // registration arrives before every node of epoch 2 is ready.
  while (!f.logged("reconfigured after losing node(s) 0 (")) REQUIRE(f.sched.try_run_once());
  f.add_worker(fixture::nodes);
  f.sched.run();
  const auto joined = f.log_position("node 6 joined: w6");
  REQUIRE(joined < f.log.size());
  CHECK(f.log[joined].find("it enters at the next step boundary") != std::string::npos);
  CHECK(f.log_position("reconfigured after losing node(s) 0 (") < joined);
  CHECK(joined < f.log_position("epoch 2 formed"));  // registered while epoch 2 formed
  const auto first = f.lose(f.initial(), {0});
  const auto admit = f.lose(fixture::after(first), {}, {6});
  REQUIRE(admit.action == planning::reconfiguration_action::continue_training);
  CHECK(f.logged("reconfigured to admit node(s) 6 (" + rules_of(admit) + ", "));
  CHECK(f.log_position("step 1: ") < f.log_position("reconfigured to admit node(s) 6"));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  f.check_steps(steps);
  f.check_pipelines(2, fixture::after(admit));
}

TEST_CASE("reconfiguration protocol: two losses at once: one plan without both, no epoch in between forms") {
  // Nodes 0 and 4 die at the same moment in the middle of step 2: the second loss arrives while
  // the first reconfiguration is being formed.
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }}});
  REQUIRE(f.records.size() == 2);
  f.kill(0);
  f.kill(4);
  f.sched.run();
  const auto both = f.lose(f.initial(), {0, 4});
  CHECK(f.logged("reconfigured after losing node(s) 0 ("));
  CHECK(f.logged("reconfigured after losing node(s) 0 4 (" + rules_of(both) + ", "));
  CHECK(!f.logged("epoch 2 formed"));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  f.check_steps(steps);
  f.check_pipelines(2, fixture::after(both));
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].lost == std::vector<std::int64_t>{0, 4});
  CHECK(f.recoveries[0].resumed_step == 2);
}

TEST_CASE("reconfiguration protocol: two losses in a row: the second in the re-run of the step, planned from the new epoch") {
  // Node 0 dies in step 1 (simple: its pipeline runs the 2-node template); epoch 2 forms; node 1
  // dies in the re-run of step 1: its pipeline is below n0 and borrows. The second plan starts
  // from epoch 2's configuration, which formed everywhere.
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  const auto first = f.lose(f.initial(), {0});
  const auto second = f.lose(fixture::after(first), {1});
  REQUIRE(first.reason == "simple");
  REQUIRE(second.reason == "borrow");
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {1, [](fake_stage_record& r) { r.hold_step = std::pair{2u, 1u}; }}});
  f.kill(0);
  f.sched.run();
  CHECK(f.logged("epoch 2 formed"));
  REQUIRE(f.status().state == "training");
  CHECK(f.records.size() == 1);  // step 1 is held by node 1 in epoch 2
  f.kill(1);
  f.sched.run();
  CHECK(f.logged("reconfigured after losing node(s) 0 (simple, "));
  CHECK(f.logged("reconfigured after losing node(s) 1 (borrow, "));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  f.check_steps(steps);
  for (std::size_t k = 1; k < steps; ++k) CHECK(f.records[k].epoch == 3);
  f.check_pipelines(1, fixture::after(second));
  CHECK(f.copies_of(2) == fixture::copies_of(first));
  CHECK(f.copies_of(3) == fixture::copies_of(second));
  // Step 1 ran in all three epochs and committed only in the last; every survivor applied it once.
  for (const auto& [id, rec] : f.stages) {
    if (id <= 1) continue;
    int commits_of_1 = 0;
    for (const auto& c : rec->commits) commits_of_1 += c.step == 1;
    CHECK(commits_of_1 == 1);
  }
  // One recovery record from the last commit to the next: both losses, both decisions.
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries.back().lost == std::vector<std::int64_t>{0, 1});
  CHECK(f.recoveries.back().action == rules_of(first) + ",borrow");
}

// Was a bug (fixed): two reconfigurations without a commit between them leave one "reconfigured" metrics
// record, not two. In the test below node 0 is lost in step 1 (epoch 2 forms, "simple"), then node
// 1 in the re-run of step 1 (epoch 3, "borrow"); on_reconfigured is called once, with
// {epoch 3, lost [1], action "borrow"}: the loss of node 0 and the epoch-2 reconfiguration appear
// in no record (coordinator_training.cpp, recover(): `st.recovering = rec` replaces the pending
// record; only its detect_ms is carried over). The record's own comment says it is "one
// reconfiguration" and `lost` "nodes lost since the last formed epoch"; README calls them one
// "reconfigured" line per recovery. Either every reconfiguration gets its record, or the merged
// record lists every node lost since the last commit (here [0, 1]).
TEST_CASE("reconfiguration protocol: two losses in a row: every lost node appears in a reconfigured record") {
  constexpr std::uint64_t steps = 3;
  fixture f(steps);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }},
           {1, [](fake_stage_record& r) { r.hold_step = std::pair{2u, 1u}; }}});
  f.kill(0);
  f.sched.run();
  f.kill(1);
  f.sched.run();
  REQUIRE(f.logged("training finished: 3 step(s) committed"));
  std::set<std::int64_t> lost;
  for (const auto& r : f.recoveries) lost.insert(r.lost.begin(), r.lost.end());
  CHECK(lost == std::set<std::int64_t>{0, 1});
}

TEST_CASE("reconfiguration protocol: a loss during a commit: the commit stands, is applied before the next epoch, and is not re-run") {
  // Every pipeline reported step 1, the coordinator decided the commit; node 2 dies while applying
  // it (its step_committed never comes). The survivors apply the commit of step 1 (the stage gets
  // it before the next epoch's assignment), step 1 is never run again, step 2 runs in epoch 2.
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  f.start({{2, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }}});
  REQUIRE(f.status().state == "committing");
  f.kill(2);
  f.sched.run();
  const auto r = f.lose(f.initial(), {2});
  CHECK(f.logged("step 1 was committed before node 2 was lost"));
  CHECK(f.logged("reconfigured after losing node(s) 2 (" + rules_of(r) + ", "));
  CHECK(f.logged("step 2 runs again"));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  CHECK(f.copies_of(2) == fixture::copies_of(r));
  for (const auto& [id, rec] : f.stages) {
    if (id == 2) continue;
    CAPTURE(id);
    int commits_of_1 = 0, runs_of_1 = 0;
    for (const auto& c : rec->commits) commits_of_1 += c.step == 1;
    for (const auto& s : rec->steps) runs_of_1 += s.step == 1;
    CHECK(commits_of_1 == 1);
    CHECK(runs_of_1 == 1);
    REQUIRE(rec->traced("commit 1 1"));
    REQUIRE(rec->traced("assign 2"));
    CHECK(rec->position("commit 1 1") < rec->position("assign 2"));  // applied before the next epoch
    for (const auto& s : rec->steps)
      if (s.step >= 2) CHECK(s.epoch == 2);
  }
  // Steps 2 and 3 committed in epoch 2 on the policy's pipelines.
  REQUIRE(f.records.size() >= 2);
  CHECK(f.records.back().step == 3);
  CHECK(f.records.back().epoch == 2);
  REQUIRE(f.recoveries.size() == 1);
  CHECK(f.recoveries[0].resumed_step == 2);
}

// Was a bug (fixed): a step whose commit was decided when a node is lost (state "committing") is counted
// (st.committed, st.step move on) but never reported: no step_record reaches on_step, so
// --metrics-out has no line for it and no "step K: loss ..." line is printed
// (coordinator_training.cpp, recover(): the "committing" branch only logs "step K was committed
// before node N was lost"). Here, with node 2 lost while applying the commit of step 1, records
// hold steps 0, 2 and 3: the loss of step 1 (known: every pipeline reported it) and the survivors'
// digests are lost, and DESIGN §5's "every committed step consumed exactly B samples" cannot be
// checked for it. README: "Each committed step prints `step K: ...`; with --metrics-out one JSON
// line per step". Expected: a record for step 1 with its loss, B samples and the digests of the
// survivors (or of every holder that replied).
TEST_CASE("reconfiguration protocol: a loss during a commit: the committed step still has its record") {
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  f.start({{2, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }}});
  REQUIRE(f.status().state == "committing");
  f.kill(2);
  f.sched.run();
  REQUIRE(f.logged("training finished: 4 step(s) committed"));
  CHECK(f.logged("step 1: loss "));
  REQUIRE(f.records.size() == steps);
  for (std::size_t k = 0; k < steps; ++k) {
    CHECK(f.records[k].step == k);
    CHECK(f.records[k].samples == 16);
  }
}

TEST_CASE("reconfiguration protocol: a loss during the last step's commit ends the job, without a new epoch") {
  constexpr std::uint64_t steps = 3;
  fixture f(steps);
  f.start({{4, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 2u}; }}});
  REQUIRE(f.status().state == "committing");
  f.kill(4);
  f.sched.run();
  CHECK(f.logged("step 2 was committed before node 4 was lost"));
  CHECK(f.logged("training finished: 3 step(s) committed"));
  CHECK(!f.logged("reconfigured after"));
  for (const auto& [id, rec] : f.stages) {
    if (id == 4) continue;
    CHECK(!rec->traced("assign 2"));
    CHECK(rec->traced("commit 1 2"));
  }
}

TEST_CASE("reconfiguration protocol: a loss during a commit, then another while the next epoch forms") {
  // Node 2 dies applying the commit of step 1; node 3 never finishes forming epoch 2 and dies
  // too. The commit stands; epoch 3 is planned from epoch 1 without 2 and 3; step 2 runs there.
  constexpr std::uint64_t steps = 4;
  fixture f(steps);
  f.start({{2, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }},
           {3, [](fake_stage_record& r) { r.hold_form = {2}; }}});
  REQUIRE(f.status().state == "committing");
  f.kill(2);
  f.sched.run();
  REQUIRE(f.status().state == "forming");
  f.kill(3);
  f.sched.run();
  const auto both = f.lose(f.initial(), {2, 3});
  REQUIRE(both.action == planning::reconfiguration_action::continue_training);
  CHECK(f.logged("reconfigured after losing node(s) 2 3 (" + rules_of(both) + ", "));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  CHECK(f.copies_of(3) == fixture::copies_of(both));
  for (const auto& [id, rec] : f.stages) {
    if (id == 2 || id == 3) continue;
    int commits_of_1 = 0, runs_of_2 = 0;
    for (const auto& c : rec->commits) commits_of_1 += c.step == 1;
    for (const auto& s : rec->steps) runs_of_2 += s.step == 2;
    CHECK(commits_of_1 == 1);
    CHECK(runs_of_2 == (rec->assignments.at(3).stages.empty() ? 0 : 1));
  }
  REQUIRE(!f.records.empty());
  CHECK(f.records.back().step == 3);
  CHECK(f.records.back().epoch == 3);
}

namespace {

/// Every layer of the fixture's model exactly once among `files`.
void check_every_layer_once(const std::vector<checkpoint_layer_file>& files, int layers) {
  std::vector<int> seen;
  for (const auto& f : files) seen.push_back(f.layer);
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) all[static_cast<std::size_t>(l)] = l;
  CHECK(seen == all);
}

}  // namespace

TEST_CASE("reconfiguration protocol: a whole pipeline lost: the survivors write each layer once, then the job stops") {
  fixture f(6, 0, true);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }}});
  REQUIRE(f.records.size() == 2);
  const auto stop = f.lose(f.initial(), {0, 1, 2});
  REQUIRE(stop.action == planning::reconfiguration_action::checkpoint_and_stop);
  f.kill(0);
  f.kill(1);
  f.kill(2);
  f.sched.run();
  CHECK(f.logged("the reconfiguration policy says checkpoint and stop: "));
  REQUIRE(f.finished.size() == 1);
  CHECK(f.finished[0].first == 2);  // steps 0 and 1 committed: the next is 2
  const int layers = static_cast<int>(f.profile.layers.size());
  check_every_layer_once(f.finished[0].second, layers);
  // Asked of the survivors only, each layer of one of them, spread over all three.
  std::size_t asked = 0;
  for (std::int64_t n : {3, 4, 5}) {
    const auto& rec = *f.stages.at(n);
    REQUIRE(rec.writes.size() <= 1);
    if (rec.writes.empty()) continue;
    CHECK(rec.writes[0].step == 2);
    CHECK(rec.writes[0].dir == "/ckpt/.tmp-2");
    asked += rec.writes[0].layers.size();
    // Only layers of its own stage in the configuration that formed.
    const auto& s = rec.assignments.at(1).stages.at(0);
    for (auto l : rec.writes[0].layers) CHECK((l >= s.first_layer && l < s.end_layer));
  }
  CHECK(asked == static_cast<std::size_t>(layers));
  REQUIRE(f.stops.size() == 1);
  CHECK(f.stops[0].dir == std::optional<std::string>("/ckpt/step-2"));
  CHECK(f.stops[0].step == 2);
  CHECK(f.stops[0].reason.find("cannot continue after losing node(s)") != std::string::npos);
  CHECK(f.logged("resume with: --resume /ckpt/step-2"));
  CHECK(f.records.size() == 2);  // nothing more committed
}

TEST_CASE("reconfiguration protocol: a holder without its layer and no other survivor: no checkpoint, the stop says so") {
  fixture f(6, 0, true);
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 2u}; }},
           {3, [](fake_stage_record& r) { r.not_held = {0, 1, 2, 3, 4, 5, 6, 7}; }}});
  REQUIRE(f.records.size() == 2);
  f.kill(0);
  f.kill(1);
  f.kill(2);
  f.sched.run();
  CHECK(f.finished.empty());
  CHECK(f.discarded == std::vector<std::string>{"/ckpt/.tmp-2"});
  REQUIRE(f.stops.size() == 1);
  CHECK(!f.stops[0].dir);
  CHECK(f.logged("no checkpoint could be written: layer "));
  CHECK(f.logged("there is no earlier checkpoint either"));
}

TEST_CASE("reconfiguration protocol: periodic checkpoints between steps, each layer once, training waits for them") {
  constexpr std::uint64_t steps = 4;
  fixture f(steps, 2);
  f.start();
  f.check_steps(steps);
  REQUIRE(f.finished.size() == 2);
  CHECK(f.finished[0].first == 2);
  CHECK(f.finished[1].first == 4);
  const int layers = static_cast<int>(f.profile.layers.size());
  for (const auto& [step, files] : f.finished) check_every_layer_once(files, layers);
  // Each writer wrote after the commit of step 1 and before step 2 ran.
  for (const auto& [id, rec] : f.stages)
    if (rec->traced("write 2")) {
      CHECK(rec->position("commit 1 1") < rec->position("write 2"));
      if (rec->traced("step 1 2")) CHECK(rec->position("write 2") < rec->position("step 1 2"));
    }
  CHECK(f.stops.empty());
  CHECK(f.logged("checkpoint of step 4 written to /ckpt/step-4"));
}

TEST_CASE("reconfiguration protocol: a node lost while a periodic checkpoint is written: abandoned, training recovers") {
  constexpr std::uint64_t steps = 4;
  fixture f(steps, 2);
  f.start({{0, [](fake_stage_record& r) { r.hold_write = true; }}});
  REQUIRE(f.records.size() == 2);
  REQUIRE(f.stages.at(0)->traced("write 2"));
  f.kill(0);
  f.sched.run();
  CHECK(f.logged("checkpoint of step 2 abandoned: node 0 was lost"));
  CHECK(f.discarded == std::vector<std::string>{"/ckpt/.tmp-2"});
  CHECK(f.logged("training finished: 4 step(s) committed"));
  f.check_steps(steps);
  REQUIRE(f.finished.size() == 1);  // step 4's
  CHECK(f.finished[0].first == 4);
}
