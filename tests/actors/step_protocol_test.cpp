// The training protocol on CAF's deterministic scheduler, with the real coordinator, pipeline and
// monitor actors and fake stages (no LibTorch): epoch formation, steps and commits as a trace,
// stale messages dropped and counted, and a stage error that stops the job instead of hanging it.

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/coordinator.hpp"
#include "actors/monitor.hpp"
#include "planning/synthetic_profile.hpp"
#include "support/coordinator_probe.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;

namespace {

const std::string token(64, 'k');

/// What one fake stage saw, and how it misbehaves.
struct fake_stage_record {
  epoch_assignment assignment;
  std::vector<std::uint64_t> epochs;      ///< every assignment's epoch, in order
  std::vector<std::uint64_t> aborted;     ///< abort() calls, by epoch
  std::vector<stage_step> steps;
  std::vector<commit_step> commits;
  std::optional<std::uint64_t> fail_at;   ///< reply to this step with an error
  std::optional<std::uint64_t> hold_at;   ///< never reply to this step
  std::optional<std::uint64_t> hold_commit_at;  ///< never reply to this step's commit
  int slot = 0;                            ///< runs stage `slot` of its node's assignment
  fake_stage_record* node = nullptr;       ///< slot 0's record (which gets the assignment); null: this
  const epoch_assignment& node_assignment() const { return node ? node->assignment : assignment; }
};

using stage_pointer = stage_actor::stateful_pointer<fake_stage_record*>;

stage_actor::behavior_type fake_stage(stage_actor::pointer self, fake_stage_record* rec) {
  return {
      [rec](epoch_assignment& a) -> form_timing {
        rec->assignment = a;
        rec->epochs.push_back(a.epoch);
        return {};
      },
      [self, rec](stage_step& s) -> caf::result<stage_done> {
        rec->steps.push_back(s);
        const auto& st = rec->node_assignment().stages.at(static_cast<std::size_t>(rec->slot));
        if (rec->hold_at && *rec->hold_at == s.step && rec->epochs.size() == 1)
          return self->make_response_promise<stage_done>();
        stage_done d{s.epoch, s.step, st.pipeline, st.stage, 0, {}};
        if (st.stage + 1 == st.num_stages) d.loss_sum = 2.0 * s.microbatches;
        if (rec->fail_at && *rec->fail_at == s.step) d.error = "injected stage failure";
        return d;
      },
      [self, rec](commit_step& c) -> caf::result<step_committed> {
        rec->commits.push_back(c);
        if (rec->hold_commit_at && *rec->hold_commit_at == c.step) return self->make_response_promise<step_committed>();
        step_committed out{c.epoch, c.step, -1, {}};
        for (const auto& st : rec->assignment.stages)  // slot 0 commits every stage of its node
          for (int l = st.first_layer; l < st.end_layer; ++l) out.digests.push_back({l, 1000u + static_cast<unsigned>(c.step)});
        return out;
      },
      [](write_checkpoint& w) -> caf::result<checkpoint_written> {  // these jobs have no checkpoints
        return checkpoint_written{w.request, -1, {}, w.layers, "no checkpoints in this test"};
      },
  };
}

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
  coordinator_actor coord;
  std::vector<std::unique_ptr<fake_stage_record>> stages;  // outlive the actors
  std::vector<monitor_actor> monitors;

  /// `slots`: the job's slots per node (M), with a tensor-parallel overhead so high that the
  /// planner gives each node M stages of width 1 rather than one wider stage.
  fixture(int nodes, std::uint64_t steps, int slots = 1) {
    coordinator_deps d;
    d.policy = {token, "hash", protocol_version, slots};
    d.expected_nodes = nodes;
    d.log = [this](const std::string& l) { log.push_back(l); };
    oobleck::planning::synthetic_gpt g;
    g.layers = 6;
    g.hidden = 32;
    g.heads = 2;
    g.sequence = 16;
    g.vocab = 256;
    g.microbatch = 2;
    g.gpus_per_node = slots;
    if (slots > 1) g.tensor_parallel_overhead = 4.0;
    g.device_memory_bytes = 1LL << 30;
    d.profile = oobleck::planning::synthetic_gpt_profile(g);
    d.job.fault_tolerance = 1;
    d.job.global_batch = 8;
    d.job.microbatch = 2;
    d.steps = steps;
    d.on_step = [this](const step_record& r) { records.push_back(r); };
    coord = sys.spawn(coordinator, std::move(d));
    sched.run();
  }
  ~fixture() {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    for (auto& m : monitors) caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// A worker of `slots` slots whose stages are fakes (one per slot); `setup` adjusts each fake
  /// before it runs.
  monitor_actor add_worker(const std::string& name, std::function<void(fake_stage_record&)> setup = {},
                           int slots = 1) {
    monitor_deps d;
    d.coordinator = coord;
    d.token = token;
    d.name = name;
    d.slots = slots;
    d.data = {"127.0.0.1", 5000};
    d.log = [this, name](const std::string& l) { log.push_back("[" + name + "] " + l); };
    d.make_stage = [this, setup, slots](const admission&) {
      spawned_stage s;
      fake_stage_record* first = nullptr;
      for (int j = 0; j < slots; ++j) {
        auto* rec = stages.emplace_back(std::make_unique<fake_stage_record>()).get();
        rec->slot = j;
        rec->node = first;
        if (setup) setup(*rec);
        if (j == 0) {
          first = rec;
          s.actor = sys.spawn(fake_stage, rec);
        } else {
          s.runners.push_back(sys.spawn(fake_stage, rec));
        }
      }
      s.abort = [first](std::uint64_t epoch, const std::string&) { first->aborted.push_back(epoch); };
      return s;
    };
    monitors.push_back(sys.spawn(monitor, std::move(d)));
    return monitors.back();
  }

  job_status status() { return oobleck::testing::request_status(self, sched, coord, token); }

  bool logged(const std::string& text) const { return oobleck::testing::log_contains(log, text); }
};

}  // namespace

TEST_CASE("step protocol: an epoch forms, every step runs on every stage and commits everywhere") {
  fixture f(4, 2);
  for (int i = 0; i < 4; ++i) f.add_worker("w" + std::to_string(i));
  f.sched.run();
  CHECK(f.logged("epoch 1 formed"));
  CHECK(f.logged("training finished: 2 step(s) committed"));
  REQUIRE(f.records.size() == 2);
  int used = 0;
  for (const auto& rec : f.stages) {
    if (rec->assignment.rank < 0) continue;
    ++used;
    REQUIRE(rec->steps.size() == 2);
    CHECK(rec->steps[0].step == 0);
    CHECK(rec->steps[1].step == 1);
    CHECK(rec->commits.size() == 2);
  }
  CHECK(used >= 2);
  // The pipelines' microbatch ranges tile the global batch (8 / 2 = 4 microbatches) exactly once.
  std::map<std::int32_t, std::int32_t> ranges;  // first -> count, one per pipeline
  for (const auto& rec : f.stages)
    if (!rec->steps.empty()) ranges[rec->steps[0].first_microbatch] = rec->steps[0].microbatches;
  std::int32_t next = 0;
  for (auto [first, count] : ranges) {
    CHECK(first == next);
    next += count;
  }
  CHECK(next == 4);
  CHECK(f.records[0].samples == 8);
  CHECK(f.records[0].loss == doctest::Approx(2.0));
  CHECK(f.records[1].layer_digests.size() == 6);
  for (const auto& [layer, digests] : f.records[1].layer_digests) CHECK(digests.size() == f.records[1].pipelines.size());
}

TEST_CASE("slots: a worker of two slots runs two stages of its pipeline, one stage actor each") {
  fixture f(2, 2, 2);
  f.add_worker("w0", {}, 2);
  f.add_worker("w1", {}, 2);
  f.sched.run();
  CHECK(f.logged("training finished: 2 step(s) committed"));
  REQUIRE(f.records.size() == 2);
  REQUIRE(f.stages.size() == 4);  // [node 0 slot 0, slot 1, node 1 slot 0, slot 1]
  for (std::size_t n = 0; n < 2; ++n) {
    CAPTURE(n);
    const auto& first = *f.stages[2 * n];
    const auto& second = *f.stages[2 * n + 1];
    // The planner put both stages of a one-node pipeline on the node, each of width 1 ...
    REQUIRE(first.assignment.stages.size() == 2);
    const auto& a = first.assignment.stages;
    CHECK(a[0].stage == 0);
    CHECK(a[1].stage == 1);
    CHECK(a[0].width == 1);
    CHECK(a[1].width == 1);
    CHECK(a[0].end_layer == a[1].first_layer);
    CHECK(a[0].next_rank == first.assignment.rank);  // its neighbour is on the node itself
    CHECK(a[1].prev_rank == first.assignment.rank);
    // ... and each stage's steps went to its own slot's actor; the node commits once.
    CHECK(first.steps.size() == 2);
    CHECK(second.steps.size() == 2);
    CHECK(first.commits.size() == 2);
    CHECK(second.commits.empty());
    CHECK(second.epochs.empty());  // only slot 0 forms the node's epoch
  }
  // Both pipelines' last stages reported their loss; every layer has a digest from both holders.
  CHECK(f.records[0].loss == doctest::Approx(2.0));
  CHECK(f.records[1].layer_digests.size() == 6);
  for (const auto& [layer, digests] : f.records[1].layer_digests) CHECK(digests.size() == 2);
}

TEST_CASE("slots: a worker whose slots differ from the job's is refused, and the job goes on") {
  fixture f(2, 3, 2);
  f.add_worker("w0", {}, 2);
  auto odd = f.add_worker("one-slot", {}, 1);
  f.self->monitor(odd);
  f.sched.run();
  CHECK(f.logged("refused worker 'one-slot': wrong_slots: the worker has 1 slot(s), the job's nodes have 2"));
  // The refused worker's monitor ends with the coordinator's reason.
  std::string reason;
  f.self->receive([&](caf::down_msg& dm) { reason = describe(dm.reason); });
  CHECK(reason.rfind("wrong_slots: ", 0) == 0);
  CHECK(f.status().state == "registering");  // still waiting for its 2nd node
  f.add_worker("w1", {}, 2);
  f.sched.run();
  CHECK(f.logged("training finished: 3 step(s) committed"));
}

TEST_CASE("slots: an epoch that gives a node more stages than it has slots is a node fault, not a crash") {
  fixture f(2, 2, 2);  // one worker of the 2 comes: the job waits, the worker is admitted
  auto m = f.add_worker("w0", {}, 2);
  f.sched.run();
  epoch_assignment a;
  a.epoch = 99;
  a.rank = 0;
  a.peers = {{"127.0.0.1", 5000}};
  a.stages.resize(3);
  caf::anon_send(m, a);
  f.sched.run();
  CHECK(f.logged("[w0] epoch 99: the epoch gives this node 3 stages; it has 2 slot(s)"));
}

TEST_CASE("step protocol: messages of another epoch or step are dropped and counted") {
  fixture f(2, 5);
  for (int i = 0; i < 2; ++i) f.add_worker("w" + std::to_string(i), [](fake_stage_record& r) { r.hold_at = 1; });
  f.sched.run();
  REQUIRE(f.records.size() == 1);  // step 1 is held by the stages
  const auto before = f.status();
  CHECK(before.state == "training");
  CHECK(before.committed_steps == 1);
  caf::anon_send(f.coord, pipeline_done{before.epoch + 7, 1, 0, 1.0, ""});  // another epoch
  caf::anon_send(f.coord, pipeline_done{before.epoch, 0, 0, 1.0, ""});      // an old step
  caf::anon_send(f.coord, step_committed{before.epoch, 0, 0, {}});          // an old commit
  caf::anon_send(f.coord, node_ready{before.epoch, 0, {}});                 // a duplicate ready
  f.sched.run();
  const auto after = f.status();
  CHECK(after.dropped_messages == before.dropped_messages + 4);
  CHECK(after.committed_steps == 1);
  CHECK(after.state == "training");
  CHECK(f.records.size() == 1);
}

TEST_CASE("step protocol: a stage error re-forms the epoch, and one that repeats stops the job instead of hanging") {
  fixture f(2, 5);
  f.add_worker("w0", [](fake_stage_record& r) { r.fail_at = 2; });
  f.add_worker("w1", [](fake_stage_record& r) { r.fail_at = 2; });
  f.sched.run();
  CHECK(f.records.size() == 2);
  CHECK(f.logged("injected stage failure; forming the epoch again"));
  CHECK(f.logged("stopping (failed): step 2 failed in pipeline"));
  CHECK(f.logged("(4 failures in a row without a lost node)"));
  // The failed step was never committed anywhere.
  for (const auto& rec : f.stages) CHECK(rec->commits.size() == 2);
}

TEST_CASE("recovery: a node lost in the middle of a step: survivors abort, a new epoch forms, the step runs again") {
  fixture f(4, 5);
  std::vector<monitor_actor> m;
  for (int i = 0; i < 4; ++i)
    m.push_back(f.add_worker("w" + std::to_string(i), [i](fake_stage_record& r) {
      if (i == 3) r.hold_at = 1;  // node 3 never finishes step 1 of the first epoch
    }));
  f.sched.run();
  REQUIRE(f.records.size() == 1);
  REQUIRE(f.status().state == "training");
  caf::anon_send_exit(m[3], caf::exit_reason::kill);  // its process dies
  f.sched.run();
  CHECK(f.logged("node 3 lost"));
  CHECK(f.logged("reconfigured after losing node(s) 3"));
  CHECK(f.logged("step 1 runs again"));
  CHECK(f.logged("training finished: 5 step(s) committed"));
  REQUIRE(f.records.size() == 5);
  for (std::size_t k = 0; k < 5; ++k) CHECK(f.records[k].step == k);
  CHECK(f.records[0].epoch == 1);
  CHECK(f.records[1].epoch == 2);  // step 1 committed in the new epoch
  for (std::size_t k = 1; k < 5; ++k)
    for (const auto& p : f.records[k].pipelines)
      for (auto n : p.first) CHECK(n != 3);  // ... on the survivors
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const auto& rec = *f.stages[i];
    REQUIRE(!rec.aborted.empty());
    CHECK(rec.aborted.front() == 1);  // the old epoch's data plane, at once (later: the shutdown)
    CHECK(rec.epochs == std::vector<std::uint64_t>{1, 2});
  }
}

TEST_CASE("recovery: a commit decided before the loss stands, and the next step runs in the new epoch") {
  fixture f(4, 4);
  std::vector<monitor_actor> m;
  for (int i = 0; i < 4; ++i)
    m.push_back(f.add_worker("w" + std::to_string(i), [i](fake_stage_record& r) {
      if (i == 2) r.hold_commit_at = 1;  // node 2 dies while applying the commit of step 1
    }));
  f.sched.run();
  REQUIRE(f.status().state == "committing");
  caf::anon_send_exit(m[2], caf::exit_reason::kill);
  f.sched.run();
  CHECK(f.logged("step 1 was committed before node 2 was lost"));
  CHECK(f.logged("step 2 runs again"));
  CHECK(f.logged("training finished: 4 step(s) committed"));
  // Every survivor applied the commit of step 1 exactly once, and never re-ran step 1.
  for (std::size_t i : {0u, 1u, 3u}) {
    CAPTURE(i);
    const auto& rec = *f.stages[i];
    int commits_of_1 = 0, runs_of_1 = 0;
    for (const auto& c : rec.commits) commits_of_1 += c.step == 1;
    for (const auto& s : rec.steps) runs_of_1 += s.step == 1;
    if (!rec.steps.empty()) CHECK(runs_of_1 == 1);
    CHECK(commits_of_1 == 1);
  }
}
