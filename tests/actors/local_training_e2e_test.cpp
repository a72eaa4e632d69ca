// oobleck-local end to end: a coordinator and 4 or 6 worker processes train the default job.
// Every committed step consumed exactly B samples, every holder of a layer reports the same
// parameter digest after every commit, and the loss curve equals the single-process run of the
// same job within 1e-4 relative (ARCHITECTURE.md §5, "nothing lost" (1)-(3), without failures). What the job
// did comes from the coordinator's events (--events-out) and the metrics, never from log lines; the
// programs' output is only read for what they tell a user on purpose (errors, --help, oobleck-local's
// own report of the workers it started and stopped).

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "apps/stage_job.hpp"
#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

apps::job_file default_job() {
  const auto r = run_process(bin + "/oobleck-local", {"--print-default-job"});
  REQUIRE(r.exit_status == 0);
  return apps::parse_job(r.out, "default job");
}

/// The last run_local: the metrics file's records ("reconfigured") and the job's events.
std::vector<nlohmann::json> last_records;
std::vector<messages::job_event> last_events;

/// oobleck-local on `nodes` workers for `steps` steps; `check` looks at the job's events (the
/// output is in the failure message). Returns the metrics' step records.
std::vector<nlohmann::json> run_local(int nodes, int steps, const std::vector<std::string>& extra = {},
                                     const std::function<void(const std::vector<messages::job_event>&)>& check = {}) {
  const testing::temp_dir tmp("oobleck-local-run-");
  const auto metrics = (tmp.path() / "metrics.jsonl").string();
  std::vector<std::string> args{"--nodes", std::to_string(nodes), "--steps", std::to_string(steps),
                                "--metrics-out", metrics, "--digest-every", "1"};  // replicas compared every step
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run_to_end(bin + "/oobleck-local", args, metrics, (tmp.path() / "events.jsonl").string(),
                            std::chrono::seconds(180));
  INFO(r.output);
  INFO(describe(r.events));
  REQUIRE(r.status == 0);
  CHECK(contains(r.events, finished(static_cast<std::uint64_t>(steps))));
  if (check) check(r.events);
  last_records = r.records;
  last_events = r.events;
  return r.steps;
}

/// A step record's breakdown (actors/step_breakdown.hpp): every part there and non-negative, and
/// the parts add up to the step's wall time plus ahead_ms (the time its orders were out before the
/// previous commit completed; rounding aside).
void check_breakdown(const nlohmann::json& m) {
  REQUIRE(m.contains("breakdown"));
  const auto& b = m["breakdown"];
  double sum = 0;
  for (const char* key : {"compute_ms", "p2p_wait_ms", "allreduce_ms", "optimizer_ms", "control_ms", "other_ms"}) {
    CAPTURE(key);
    REQUIRE(b.contains(key));
    CHECK(b[key].get<double>() >= 0);
    sum += b[key].get<double>();
  }
  CHECK(b["compute_ms"].get<double>() > 0);
  CHECK(b["optimizer_ms"].get<double>() > 0);
  REQUIRE(b.contains("ahead_ms"));
  const double ahead = b["ahead_ms"].get<double>();
  CHECK(ahead >= 0);
  const double wall = m["wall_ms"].get<double>();
  CHECK(std::abs(sum - wall - ahead) <= 1e-6 * wall + 1e-6);
}

/// Which layers every node of a step's line runs (its pipelines' "stage_layers").
std::map<std::int64_t, std::set<int>> held_layers(const nlohmann::json& line) {
  std::map<std::int64_t, std::set<int>> held;
  for (const auto& p : line["pipelines"]) {
    const auto& bounds = p["stage_layers"];
    REQUIRE(bounds.size() == p["nodes"].size() + 1);
    for (std::size_t k = 0; k < p["nodes"].size(); ++k)
      for (int l = bounds[k].get<int>(); l < bounds[k + 1].get<int>(); ++l) held[p["nodes"][k].get<std::int64_t>()].insert(l);
  }
  return held;
}

void check_run(int nodes, const std::vector<std::string>& extra = {},
               const std::function<void(const std::vector<messages::job_event>&)>& expect = {},
               std::set<std::int64_t> gone = {}, int lost_at = -1, int steps = 12) {
  const auto job = default_job();
  const auto reference = actors::train_single_process(apps::stage_job_for(job), steps);
  last_records.clear();
  const auto lines = run_local(nodes, steps, extra, expect);
  if (lost_at >= 0) CHECK(last_records.size() == 1u);
  if (extra.empty()) {
    CHECK(last_records.empty());
    // One epoch, formed once, no loss: the first plan ran every step.
    CHECK(count(last_events, {.kind = event_kind::epoch_formed}) == 1u);
    CHECK(!contains(last_events, {.kind = event_kind::node_lost}));
  }
  if (lost_at >= 0 && !last_records.empty()) {
    const auto& e = last_records.front();
    CHECK(e["event"] == "reconfigured");
    CHECK(e["lost"] == nlohmann::json::array({*gone.begin()}));
    CHECK(e["resumed_step"] == lost_at);
    // The epoch formed after the loss copies layers exactly when a survivor now runs a layer it
    // did not hold before (its stage in the step before the loss); a merge whose templates cut the
    // layers where the old ones did needs none (the cuts come from the profile measured at start).
    // When a later epoch is the one that stood, a first attempt of the same plan that failed to
    // form everywhere under load may already have copied them: only "none needed, none copied"
    // holds then.
    REQUIRE(lines.size() > static_cast<std::size_t>(lost_at));
    const auto before = held_layers(lines[static_cast<std::size_t>(lost_at) - 1]);
    const auto after = held_layers(lines[static_cast<std::size_t>(lost_at)]);
    bool needed = false;
    for (const auto& [node, layers] : after)
      for (auto l : layers) needed = needed || !before.contains(node) || !before.at(node).contains(l);
    CAPTURE(lines[static_cast<std::size_t>(lost_at) - 1]["pipelines"].dump());
    CAPTURE(lines[static_cast<std::size_t>(lost_at)]["pipelines"].dump());
    if (!needed) CHECK(e["copy_bytes"].get<std::int64_t>() == 0);
    else if (e["epoch"].get<int>() == 2) CHECK(e["copy_bytes"].get<std::int64_t>() > 0);
    CHECK(e["downtime_ms"].get<double>() > 0);
    CHECK(e["plan_ms"].get<double>() < 1000);
    MESSAGE("recovery: " << e.dump());
  }
  REQUIRE(lines.size() == steps);
  for (int k = 0; k < steps; ++k) {
    const auto& m = lines[static_cast<std::size_t>(k)];
    CAPTURE(k);
    CHECK(m["step"] == k);
    CHECK(m["samples"] == job.training.global_batch);
    int microbatches = 0, pipelines = 0;
    std::set<std::int64_t> used;
    for (const auto& p : m["pipelines"]) {
      microbatches += p["microbatches"].get<int>();
      ++pipelines;
      for (const auto& n : p["nodes"]) {
        CHECK(used.insert(n.get<std::int64_t>()).second);
        if (k >= lost_at && lost_at >= 0) CHECK(gone.count(n.get<std::int64_t>()) == 0);
      }
    }
    // Epoch 1 until the loss, a later one after it (2, or 3 when the data plane saw the crash
    // before the coordinator did and the epoch was formed once more first).
    if (lost_at >= 0) CHECK((k < lost_at ? m["epoch"].get<int>() == 1 : m["epoch"].get<int>() >= 2));
    CHECK(microbatches * job.training.microbatch == job.training.global_batch);
    CHECK(pipelines >= 2);  // f = 1
    REQUIRE(m["layer_digests"].size() == static_cast<std::size_t>(job.model.num_layers()));
    for (const auto& [layer, digests] : m["layer_digests"].items()) {
      CAPTURE(layer);
      CHECK(digests.size() == static_cast<std::size_t>(pipelines));  // one holder per pipeline
      for (const auto& d : digests) CHECK(d == digests[0]);
    }
    check_breakdown(m);
    // Failure-free, nothing due between steps: every step after the first went out with its
    // previous step's commit (run-ahead), so its orders were out before that commit completed.
    if (extra.empty()) CHECK((k == 0) == (m["breakdown"]["ahead_ms"].get<double>() == 0));
    const double loss = m["loss"].get<double>();
    CHECK(std::abs(loss - reference[static_cast<std::size_t>(k)]) <= 1e-4 * std::abs(reference[static_cast<std::size_t>(k)]));
  }
  CHECK(lines.back()["loss"].get<double>() < lines.front()["loss"].get<double>());
}

}  // namespace

TEST_CASE("oobleck-local: 4 worker processes train the default job exactly like one process") { check_run(4); }

TEST_CASE("oobleck-local: 6 worker processes train the default job exactly like one process") { check_run(6); }

TEST_CASE("oobleck-local: a worker killed in the middle of a step: recovery, and still exactly the single-process run") {
  // Node 2 SIGKILLs itself in step 5: the survivors abort, re-form 2 pipelines on 5 nodes with
  // layer copies (parameters and AdamW state), and step 5 runs again; nothing of the training
  // changes: every step B samples, equal replicas, the loss of the run without failures.
  check_run(
      6, {"--fail-at", "5:2"},
      [](const std::vector<messages::job_event>& events) {
        // Node 2 was lost in step 5 (its fault fired: oobleck-local exits 1 otherwise; or in step 4's
        // commit, which stood, as it started step 5 ahead), the policy re-formed the job without it,
        // and step 5 ran again after that: in this order.
        const auto lost = loss_in_step(events, 2, 5);
        const auto forming = position(events, {.kind = event_kind::epoch_forming, .step = 5, .lost = {{2}}});
        CHECK(lost < forming);
        REQUIRE(forming < events.size());
        CHECK(position(events, {.kind = event_kind::step_committed, .step = 5}, forming) < events.size());
        CHECK(count(events, {.kind = event_kind::node_lost}) == 1u);
      },
      {2}, 5);
}

TEST_CASE("oobleck-local: training.precision = \"bf16\" reaches every worker: the single process's bf16 curve, not fp32's") {
  const testing::temp_dir tmp("oobleck-local-bf16-");
  auto job_text = run_process(bin + "/oobleck-local", {"--print-default-job"}).out;
  const auto at = job_text.find("[training]\n");
  REQUIRE(at != std::string::npos);
  job_text.insert(at + std::string("[training]\n").size(), "precision = \"bf16\"\n");
  std::ofstream(tmp.path() / "job.toml") << job_text;
  const auto job = apps::parse_job(job_text, "job");
  REQUIRE(job.model.precision == runtime::precision_kind::bf16);
  constexpr int steps = 8;
  const auto bf16 = actors::train_single_process(apps::stage_job_for(job), steps);
  const auto fp32 = actors::train_single_process(apps::stage_job_for(default_job()), steps);
  const auto lines = run_local(4, steps, {"--config", (tmp.path() / "job.toml").string()});
  REQUIRE(lines.size() == steps);
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    const auto i = static_cast<std::size_t>(k);
    const double loss = lines[i]["loss"].get<double>();
    CHECK(lines[i]["samples"] == job.training.global_batch);
    for (const auto& [layer, digests] : lines[i]["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    // bf16 rounding turns the pipelines' other sum order into more than fp32's 1e-4 (runtime
    // equivalence test), still far below bf16's distance from fp32.
    CHECK(std::abs(loss - bf16[i]) <= 2e-3 * std::abs(bf16[i]));
  }
  // For this small model bf16's loss is within ~1e-5 of fp32's, as close as later steps of two
  // bf16 runs are to each other. Step 0 tells them apart: the same weights, so only the forward's
  // precision and the order of summing microbatch losses in double differ (measured: 0 against
  // the bf16 run, 4.2e-6 against fp32).
  const double first = lines.front()["loss"].get<double>();
  MESSAGE("step 0: |cluster - single bf16| " << std::abs(first - bf16[0]) << ", |cluster - single fp32| "
                                             << std::abs(first - fp32[0]));
  CHECK(std::abs(first - bf16[0]) < 0.01 * std::abs(first - fp32[0]));
  CHECK(lines.back()["loss"].get<double>() < lines.front()["loss"].get<double>());
}

TEST_CASE("oobleck-local: workers that join during training enter at a step boundary, and nothing else changes") {
  // 4 workers, 2 more started after step 2: they register while the job trains, enter at the
  // next step boundary (a 3rd pipeline once both are in, its layers copied from the others), and
  // the run still equals the single-process one, every step B samples, equal replicas.
  check_run(
      4, {"--join-at", "2:2"},
      [](const std::vector<messages::job_event>& events) {
        // Nodes 4 and 5 registered after step 2 committed and were admitted at step boundaries (no
        // epoch formed between their registration and the next step's commit ran without them):
        // each appears in the joined list of a reconfiguration whose step follows its registration.
        for (std::int64_t n : {4, 5}) {
          CAPTURE(n);
          const auto joined = position(events, {.kind = event_kind::node_joined, .node = n});
          REQUIRE(joined < events.size());
          CHECK(position(events, {.kind = event_kind::step_committed, .step = 2}) < joined);
          bool admitted = false;
          for (std::size_t i = joined; i < events.size(); ++i)
            if (events[i].kind == event_kind::epoch_forming &&
                std::find(events[i].joined.begin(), events[i].joined.end(), n) != events[i].joined.end()) {
              admitted = true;
              CHECK(events[i].lost.empty());
              CHECK(events[i].detail == "join");
            }
          CHECK(admitted);
        }
        CHECK(!contains(events, {.kind = event_kind::node_lost}));
      },
      {}, -1, 150);
  for (const auto& e : last_records) {
    CHECK(e["event"] == "reconfigured");
    CHECK(e["lost"].empty());
    CHECK(e["action"] == "join");
  }
  CHECK(!last_records.empty());
}

TEST_CASE("oobleck-local: a worker started by --join-at that has not registered when the job ends is stopped at once") {
  // A worker started near the end of the job needs ~0.7 s to register (LibTorch, here, quiet), and
  // a step takes 15-50 ms: the job ends before it registers. It used to keep waiting for the gone
  // coordinator, and oobleck-local for it, 10 s after the job had finished.
  // Which step is "near the end" depends on the machine's load: too early and the worker registers
  // (then it is an ordinary join), too late and the job ends before oobleck-local read the step's
  // commit (then it starts no one, and says so). Both are correct behaviours but not this case's:
  // the run is repeated, moving the join, until the case happens, and every run is checked.
  // A --join-at past the job's end starts nothing, and says so.
  int join = 37;
  bool happened = false;
  for (int attempt = 0; attempt < 6 && !happened; ++attempt) {
    const testing::temp_dir tmp("oobleck-late-join-");
    const auto events = (tmp.path() / "events.jsonl").string();
    const auto started = std::chrono::steady_clock::now();
    const auto r = run_process(bin + "/oobleck-local", {"--nodes", "4", "--steps", "40", "--join-at",
                                                        std::to_string(join) + ":1", "--join-at", "50:2",
                                                        "--events-out", events});
    const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    INFO("join at step " << join << ":\n" << r.out);
    const auto job = read_event_file(events);
    INFO(describe(job));
    REQUIRE(r.exit_status == 0);
    CHECK(contains(job, finished(40)));
    // What oobleck-local tells its user on purpose: the worker it started, that it stopped it, and the
    // --join-at that never came (its own lines, not the coordinator's).
    CHECK(r.out.find("[local] --join-at 50:2 started no worker: the job ended before it saw step 50 commit") !=
          std::string::npos);
    const auto joined = count(job, {.kind = event_kind::node_joined});
    const bool started_it =
        r.out.find("[local] step " + std::to_string(join) + " committed: starting 1 more worker(s)") != std::string::npos;
    if (!started_it) {  // the job ended first: said so, truthfully
      CHECK(joined == 4u);
      CHECK(r.out.find("[local] --join-at " + std::to_string(join) + ":1 started no worker: the job ended right after step " +
                       std::to_string(join) + " committed") != std::string::npos);
      MESSAGE("the job ended before oobleck-local started the worker of step " << join << "; trying earlier");
      join -= 2;
    } else if (joined == 5u) {  // it registered in time: an ordinary join, and it left with the job
      CHECK(r.out.find("had not registered when the job ended") == std::string::npos);
      MESSAGE("the worker started after step " << join << " registered in time; trying later");
      join = std::min(join + 1, 38);
    } else {
      happened = true;
      CHECK(joined == 4u);  // node4 never registered
      CHECK(r.out.find("[local] worker node4 had not registered when the job ended: stopped it") != std::string::npos);
      MESSAGE("40 steps with a late join after step " << join << " took " << took << " s");
    }
  }
  CHECK(happened);
}

TEST_CASE("oobleck-local: a bad job file is refused before any process starts") {
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-local-bad-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "job.toml") << "[training]\nmicrobatch = 3\nglobal_batch = 16\n";
  const auto r = run_process(bin + "/oobleck-local", {"--config", (dir / "job.toml").string()});
  std::filesystem::remove_all(dir);
  CHECK(r.exit_status == 2);
  CHECK(r.err.rfind("error: ", 0) == 0);
  CHECK(r.out.empty());
}

TEST_CASE("oobleck-local: --help offers the job's events to scripts") {
  // What a user is told on purpose: the flag that gives scripts what happened (not the log lines).
  const auto r = run_process(bin + "/oobleck-local", {"--help"});
  CHECK(r.exit_status == 0);
  CHECK(r.out.find("--events-out") != std::string::npos);
}

TEST_CASE("oobleck-local: --trace flags are checked before any process starts") {
  const testing::temp_dir tmp("oobleck-local-trace-flags-");
  const auto& dir = tmp.path();
  const auto good = (dir / "good.csv").string();
  std::ofstream(good) << "0,add,a\n0,add,b\n0,add,c\n0,add,d\n1000,remove,a\n";
  const auto garbage = (dir / "garbage.csv").string();
  std::ofstream(garbage) << "0,add,a\n0,add,b\nthis is not a trace line\n";
  auto refused = [&](const std::vector<std::string>& args, const std::string& message) {
    const auto r = run_process(bin + "/oobleck-local", args);
    INFO(r.err);
    CHECK(r.exit_status == 2);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(r.err.find(message) != std::string::npos);
    CHECK(r.out.empty());  // nothing started, not even the coordinator
  };
  refused({"--trace", (dir / "missing.csv").string()}, "cannot read trace file " + (dir / "missing.csv").string());
  refused({"--trace", garbage}, garbage + " line 3: ");
  refused({"--trace", good, "--time-scale", "-1"}, "--time-scale must be >= 0, got -1");
  refused({"--trace", good, "--time-scale", "0"}, "--time-scale must be > 0");
  refused({"--trace", good, "--time-scale", "fast"}, "--time-scale expects a finite number");
  refused({"--time-scale", "0.5"}, "--time-scale goes with --trace");
  refused({"--trace-nodes", "4"}, "--trace-nodes goes with --trace");
  refused({"--trace", good, "--trace-nodes", "0"}, "--trace-nodes");
  refused({"--trace", good, "--fail-at", "3:1"}, "--trace replaces --fail-at");
}

TEST_CASE("cluster: a hung worker is replaced, and when it wakes up it changes nothing and exits") {
  // Separate processes (not oobleck-local) so the test can wake the frozen worker itself.
  const testing::temp_dir tmp("oobleck-fencing-");
  const auto& dir = tmp.path();
  auto job_text = run_process(bin + "/oobleck-local", {"--print-default-job"}).out;
  const auto at = job_text.find("[cluster]");
  REQUIRE(at != std::string::npos);
  job_text.insert(at + std::string("[cluster]\n").size(), "heartbeat_interval_ms = 200\nconnection_timeout_ms = 2000\n");
  std::ofstream(dir / "job.toml") << job_text;
  const auto job = apps::parse_job(job_text, "job");
  constexpr int steps = 40;
  const std::string metrics = (dir / "metrics.jsonl").string();
  const std::string events = (dir / "events.jsonl").string();
  background_process coordinator(bin + "/oobleck-coordinator",
                                 {"--listen", "127.0.0.1:0", "--config", (dir / "job.toml").string(), "--token-file",
                                  (dir / "token").string(), "--steps", std::to_string(steps), "--metrics-out", metrics,
                                  "--events-out", events, "--address-file", (dir / "address").string(),
                                  "--digest-every", "1"});
  const std::string address = wait_for_address((dir / "address").string());
  std::vector<std::unique_ptr<background_process>> workers;
  for (int i = 0; i < job.cluster.nodes; ++i)
    workers.push_back(std::make_unique<background_process>(
        bin + "/oobleck-worker",
        std::vector<std::string>{"--coordinator", address, "--token-file", (dir / "token").string(), "--name",
                                 "w" + std::to_string(i), "--heartbeat-interval-ms", "200", "--connection-timeout-ms",
                                 "2000", "--coordinator-grace", "30"}));  // exits within the wait below either way
  wait_for_event(events, {.kind = event_kind::step_committed, .step = 3});
  // Node 2 is whichever worker registered third.
  const auto name = worker_name(events, 2);
  auto& victim = *workers.at(static_cast<std::size_t>(std::stoi(name.substr(1))));
  victim.signal(SIGSTOP);
  wait_for_event(events, {.kind = event_kind::node_lost, .node = 2}, std::chrono::seconds(30));
  wait_for_event(events, {.kind = event_kind::epoch_forming, .lost = {{2}}}, std::chrono::seconds(30));
  victim.signal(SIGCONT);  // it wakes up after it was replaced
  CHECK(victim.wait_exit(std::chrono::seconds(60)) == 3);  // 3: lost contact with the coordinator
  // What the woken worker tells its user on purpose: it lost the coordinator, and the coordinator
  // told it that it went on without it (rather than the worker waiting out its 60 s of grace:
  // CAF 0.17 could leave its new connection unanswerable, apps/coordinator_link.hpp).
  CHECK(victim.output().find("lost contact with the coordinator") != std::string::npos);
  CHECK(victim.output().find("refused by the coordinator: unknown_node") != std::string::npos);
  CHECK(coordinator.wait_exit(std::chrono::seconds(180)) == 0);
  INFO(coordinator.output());
  const auto happened = read_event_file(events);
  INFO(describe(happened));
  CHECK(contains(happened, finished(steps)));
  CHECK(count(happened, {.kind = event_kind::node_lost}) == 1u);
  // Every step committed once, by every holder of a layer alike, and the woken node is in none after
  // its loss.
  std::ifstream in(metrics);
  int count = 0;
  for (std::string l; std::getline(in, l);) {
    const auto m = nlohmann::json::parse(l);
    if (m.contains("event")) continue;
    ++count;
    CHECK(m["step"] == count - 1);
    CHECK(m["samples"] == job.training.global_batch);
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
  }
  CHECK(count == steps);
  for (auto& w : workers)
    if (w.get() != &victim) CHECK(w->wait_exit(std::chrono::seconds(30)) == 0);
}
