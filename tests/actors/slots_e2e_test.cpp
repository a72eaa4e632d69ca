// Nodes of several slots (ARCHITECTURE.md §4's M; the job's cluster.slots_per_node, every worker started
// with --slots M) through oobleck-local: a node runs every stage the planner gives it, one stage
// actor per stage, adjacent stages of a node handing activations and gradients over in memory,
// and the training equals the single-process run of the same job within 1e-4 (ARCHITECTURE.md §5,
// "nothing lost" (1)-(3)): every step B samples, every layer's holders bitwise equal.
//
// What each run did is read from the coordinator's events (--events-out; an epoch's shape is its
// epoch_formed detail) and the metrics, never from log lines.
//
// The jobs carry a profile (written here, for the job's config hash) in which a stage of width 2
// is slower than two of width 1, so the planner cuts nodes into stages of width 1; the synthetic
// profile would give each node one stage of width 2, the case of the third test.

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "apps/stage_job.hpp"
#include "messages/profile_file.hpp"
#include "planning/planner.hpp"
#include "support/apps_dir.hpp"
#include "support/local_run.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

struct job_dir {
  std::filesystem::path dir;
  job_dir() {
    dir = std::filesystem::temp_directory_path() / ("oobleck-slots-" + std::to_string(::getpid()) + "-" + std::to_string(++count));
    std::filesystem::create_directories(dir);
  }
  ~job_dir() { std::filesystem::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  static inline int count = 0;
};

/// A tiny GPT (6 layers) on 2 nodes of 2 slots, planned from profile.json beside the job file
/// (run_against_single_process writes it); `cluster` adds keys to [cluster]. Heartbeats are
/// lenient: 2 workers of 2 threads each share 2 cores with other tests, and no node is lost here.
std::string job_text(int fault_tolerance, const std::string& cluster, int nodes = 2) {
  return "[model]\nvocab = 256\nd_model = 32\nheads = 2\nblocks = 4\nseq_len = 16\nseed = 99\n"
         "[data]\ncorpus_bytes = 32768\n"
         "[training]\nsteps = 5\nglobal_batch = 8\nmicrobatch = 2\n"
         "[cluster]\nnodes = " + std::to_string(nodes) + "\nslots_per_node = 2\nheartbeat_interval_ms = 500\nconnection_timeout_ms = 10000\n"
         "fault_tolerance = " +
         std::to_string(fault_tolerance) + "\n" + cluster + "[profile]\nfile = \"profile.json\"\n" +
         "[faults]\ndigest_every = 1\n";  // the replicas compared after every step
}

/// A profile of the job's model for M = 2 in which width 2 takes 3x the time of width 1 (so two
/// stages of width 1 beat one of width 2), 1 MB of parameters and 0.1 MB of activations a layer.
void write_profile(const job_dir& d, const apps::job_file& job) {
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < job.model.num_layers(); ++l)
    layers.push_back({{"name", "layer" + std::to_string(l)},
                      {"forward_ms", {{"1", 1.0}, {"2", 3.0}}},
                      {"backward_ms", {{"1", 2.0}, {"2", 6.0}}},
                      {"param_bytes", 1000000},
                      {"activation_bytes", 100000}});
  const nlohmann::json p{{"model", "tiny"},
                         {"microbatch_size", job.training.microbatch},
                         {"gpus_per_node", 2},
                         {"device_memory_bytes", job.cluster.device_memory_bytes},
                         {"config_hash", job.model.hash()},
                         {"device_kind", "cpu"},
                         {"layers", layers}};
  std::ofstream(d.path("profile.json")) << p.dump();
}

/// The modelled profile of the job's model (planning/synthetic_profile.hpp), on which a stage of
/// width 2 beats two of width 1: what the planner's own check below plans from too (a profile
/// measured at the job's start would make the shape depend on this machine's load).
void write_modelled_profile(const job_dir& d, const apps::job_file& job) {
  messages::write_profile_json(apps::modelled_profile(job), d.path("profile.json"));
}

/// Runs the job of `text` (on its cluster.nodes workers) for `steps` steps, with `extra` flags,
/// planned from the hand-made profile (write_profile) `with_profile`, else from the modelled one;
/// checks it against the single-process run and returns the run (its events; the metrics' records:
/// none unless `extra` injects a failure).
local_run run_against_single_process(const std::string& text, bool with_profile, int steps = 5,
                                   const std::vector<std::string>& extra = {}) {
  job_dir d;
  std::ofstream(d.path("job.toml")) << text;
  const auto job = apps::read_job_file(d.path("job.toml"));
  if (with_profile) write_profile(d, job);
  else write_modelled_profile(d, job);
  const auto reference = actors::train_single_process(apps::stage_job_for(job), static_cast<std::uint64_t>(steps));
  std::vector<std::string> args{"--config", d.path("job.toml"), "--steps", std::to_string(steps), "--metrics-out",
                                d.path("metrics.jsonl"), "--timeout", "150"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto run = run_to_end(bin + "/oobleck-local", args, d.path("metrics.jsonl"), d.path("events.jsonl"),
                        std::chrono::seconds(170));
  INFO(run.output);
  INFO(describe(run.events));
  REQUIRE(run.status == 0);
  CHECK(contains(run.events, finished(static_cast<std::uint64_t>(steps))));
  if (extra.empty()) CHECK(run.records.empty());  // no reconfiguration
  REQUIRE(run.steps.size() == static_cast<std::size_t>(steps));
  // Steps whose commit was decided before a loss: the lost node's digests may never arrive (with
  // run-ahead it dies in the next step, its digests still on their thread), and the coordinator
  // records those that did, as recovery_e2e_support.cpp checks them.
  std::set<std::uint64_t> committed_before_loss;
  for (const auto& e : all_of(run.events, {.kind = event_kind::commit_stood})) committed_before_loss.insert(e.step);
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    const auto& m = run.steps[static_cast<std::size_t>(k)];
    CHECK(m["step"] == k);
    CHECK(m["samples"] == job.training.global_batch);
    const std::size_t pipelines = m["pipelines"].size();
    REQUIRE(m["layer_digests"].size() == static_cast<std::size_t>(job.model.num_layers()));
    for (const auto& [layer, digests] : m["layer_digests"].items()) {
      CAPTURE(layer);
      if (committed_before_loss.count(static_cast<std::uint64_t>(k)))  // one holder per pipeline, less the lost one
        CHECK((digests.size() == pipelines || digests.size() + 1 == pipelines));
      else
        CHECK(digests.size() == pipelines);  // one holder per pipeline, bitwise equal
      for (const auto& x : digests) CHECK(x == digests[0]);
    }
    const double loss = m["loss"].get<double>();
    const double want = reference[static_cast<std::size_t>(k)];
    CHECK(std::abs(loss - want) <= 1e-4 * std::abs(want));
  }
  CHECK(run.steps.back()["loss"].get<double>() < run.steps.front()["loss"].get<double>());
  return run;
}

/// The shape of epoch `epoch` ("S stage(s) x M microbatch(es)" per pipeline) from its epoch_formed
/// event ("" when it did not form).
std::string shape_of(const local_run& run, std::uint64_t epoch) {
  const auto formed = all_of(run.events, {.kind = event_kind::epoch_formed, .epoch = epoch});
  return formed.empty() ? "" : formed.front().detail;
}

/// Every step of the run on one-node pipelines: node n's pipeline is node n alone, so a pipeline's
/// stages are all stages of one node (the node's slots).
void check_one_node_pipelines(const local_run& run) {
  for (const auto& m : run.steps)
    for (const auto& p : m["pipelines"]) CHECK(p["nodes"].size() == 1u);
}

}  // namespace

TEST_CASE("slots: 2 workers of 2 slots, each running both stages of a pipeline, train exactly like one process") {
  // f = 1: 2 pipelines of one node each; a node's two stages hand over in memory, and each layer's
  // gradient all-reduce joins the two nodes (two reducers per node, one per stage).
  const auto run = run_against_single_process(job_text(1, ""), true);
  CHECK(shape_of(run, 1) == "2 stage(s) x 2 microbatch(es), 2 stage(s) x 2 microbatch(es)");
  check_one_node_pipelines(run);  // so each node runs both stages of its pipeline
}

TEST_CASE("slots: one pipeline of 4 stages on 2 workers of 2 slots trains exactly like one process") {
  // f = 0 and slots of 10 MB: one node cannot hold the model (~24 MB of state), two can, so the
  // pipeline spans both nodes: stages 0-1 on one, 2-3 on the other (in memory within a node,
  // over the transport between them).
  const auto run = run_against_single_process(job_text(0, "device_memory_bytes = 10485760\n"), true);
  CHECK(shape_of(run, 1) == "4 stage(s) x 4 microbatch(es)");
  for (const auto& m : run.steps) {
    REQUIRE(m["pipelines"].size() == 1u);
    CHECK(m["pipelines"][0]["nodes"].size() == 2u);  // 4 stages on 2 nodes of 2 slots
  }
}

TEST_CASE("slots: 2 workers of 2 slots, one stage of width 2 each (2 intra-op threads), train exactly like one process") {
  // The modelled profile: it makes a stage of width 2 faster than two of width 1, so each
  // one-node pipeline is a single stage spanning both of its node's slots (layers [0, 6)).
  const auto run = run_against_single_process(job_text(1, ""), false, 3);
  CHECK(shape_of(run, 1) == "1 stage(s) x 2 microbatch(es), 1 stage(s) x 2 microbatch(es)");
  check_one_node_pipelines(run);
  // The width: the planner, on the same synthetic profile as the coordinator, gives that one stage
  // both of its node's slots.
  const auto job = apps::parse_job(job_text(1, ""), "job");
  const auto profile = apps::modelled_profile(job);
  const auto plan = planning::plan_job(profile, apps::planner_job(job, job.cluster.nodes, job.cluster.fault_tolerance));
  REQUIRE(plan.pipelines.size() == 2u);
  for (const auto& p : plan.pipelines) {
    const auto* t = plan.templates.find(p.template_nodes);
    REQUIRE(t != nullptr);
    REQUIRE(t->stages.size() == 1u);
    CHECK(t->stages[0].gpus == 2);
  }
}

TEST_CASE("slots: a worker of 2 slots killed in the middle of a step: recovery with layer copies, still exactly one process") {
  // 5 workers of 2 slots, f = 1, slots of 10 MB (n0 = 2): pipelines of 3 and 2 nodes, two
  // stages per node. Node 4 kills itself in step 2: the survivors abort (the stages of a node
  // waiting on each other too), the policy re-forms the pipelines, nodes receive the layers of
  // their new stages from surviving replicas, and step 2 runs again.
  const auto r = run_against_single_process(job_text(1, "device_memory_bytes = 10485760\n", 5), true, 5,
                                            {"--fail-at", "2:4"});
  // Node 4 was lost in step 2 (its fault fired; or in step 1's commit, which stood, as it started
  // step 2 ahead), the policy borrowed, and step 2 ran again after.
  INFO(describe(r.events));
  const auto lost = loss_in_step(r.events, 4, 2);
  const auto forming = position(r.events, {.kind = event_kind::epoch_forming, .step = 2, .lost = {{4}}});
  CHECK(lost < forming);
  REQUIRE(forming < r.events.size());
  CHECK(r.events[forming].detail.rfind("borrow", 0) == 0);
  CHECK(position(r.events, {.kind = event_kind::step_committed, .step = 2}, forming) < r.events.size());
  // Heterogeneous pipelines of two stages per node (a 3-node and a 2-node one), then node 4's
  // pipeline borrows a node of the other: 2 pipelines of 2 nodes, 4 stages each.
  CHECK(shape_of(r, 1) == "6 stage(s) x 2 microbatch(es), 4 stage(s) x 2 microbatch(es)");
  CHECK(shape_of(r, r.events[forming].epoch) == "4 stage(s) x 2 microbatch(es), 4 stage(s) x 2 microbatch(es)");
  REQUIRE(r.records.size() == 1);
  CHECK(r.records[0]["event"] == "reconfigured");
  CHECK(r.records[0]["lost"] == nlohmann::json::array({4}));
  CHECK(r.records[0]["resumed_step"] == 2);
  CHECK(r.records[0]["copy_bytes"].get<std::int64_t>() > 0);
}
