#include "actors/recovery_e2e_support.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"
#include "support/temp_dir.hpp"

namespace oobleck::testing {

const std::string bin = OOBLECK_APPS_DIR;

namespace {

const std::string& default_job_text() { return testing::default_job_text(bin); }

/// The nodes the coordinator declared lost in a run.
std::set<int> lost_nodes(const run_result& r) {
  std::set<int> out;
  for (const auto& e : all_of(r.events, {.kind = messages::event_kind::node_lost})) out.insert(static_cast<int>(e.node));
  return out;
}

std::vector<int> ints(const std::vector<std::int64_t>& ids) { return {ids.begin(), ids.end()}; }

/// The run with every node named by the id its worker first had. A coordinator fault changes
/// what the ids show, not what happened: a coordinator frozen past the heartbeat timeout loses
/// every node at once (node_lost events), then adopts them back under new ids (each worker's
/// node_joined again, with its name). Here each id is mapped to its worker's first one, and a
/// loss followed by the same worker's return is dropped. Without a coordinator fault no worker
/// registers twice, and the run is unchanged.
run_result in_first_ids(const run_result& r) {
  using messages::event_kind;
  std::map<std::int64_t, std::int64_t> first;  // id -> the first id of its worker
  std::map<std::string, std::int64_t> by_name;
  std::map<std::string, std::size_t> last_joined;  // worker -> its last node_joined's position
  std::map<std::int64_t, std::string> name_of;
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const auto& e = r.events[i];
    if (e.kind != event_kind::node_joined) continue;
    first[e.node] = by_name.emplace(e.detail, e.node).first->second;
    name_of[e.node] = e.detail;
    last_joined[e.detail] = i;
  }
  auto id = [&](std::int64_t n) { return first.count(n) ? first.at(n) : n; };
  auto ids = [&](std::vector<std::int64_t> v) {
    for (auto& n : v) n = id(n);
    return v;
  };
  run_result out = r;
  out.events.clear();
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    auto e = r.events[i];
    if (e.kind == event_kind::node_lost && name_of.count(e.node) && last_joined.at(name_of.at(e.node)) > i)
      continue;  // it came back
    if (e.node >= 0) e.node = id(e.node);
    e.lost = ids(e.lost);
    e.joined = ids(e.joined);
    out.events.push_back(std::move(e));
  }
  for (auto& m : out.steps)
    for (auto& p : m["pipelines"]) p["nodes"] = ids(p["nodes"].get<std::vector<std::int64_t>>());
  for (auto& rec : out.records)
    for (const char* key : {"lost", "joined"})
      if (rec.contains(key)) rec[key] = ids(rec[key].get<std::vector<std::int64_t>>());
  return out;
}

}  // namespace

job_case make_job(int nodes, int f, std::int64_t memory, const job_keys& more) {
  return testing::make_job(bin, nodes, f, memory, more);
}

const job_keys slow_heartbeats{
    {"cluster", "heartbeat_interval_ms", "1000"}, {"cluster", "connection_timeout_ms", "30000"}};

const std::vector<double>& reference_losses(int steps) {
  static std::vector<double> losses;
  if (static_cast<int>(losses.size()) < steps)
    losses = actors::train_single_process(apps::stage_job_for(apps::parse_job(default_job_text(), "job")), steps);
  return losses;
}

run_result run_local(const job_case& c, int steps, const std::vector<std::string>& extra,
                     const std::function<void(running_local&)>& during) {
  const testing::temp_dir tmp("oobleck-recovery-");
  const auto& dir = tmp.path();
  write_job(c, dir);
  const auto metrics = (dir / "metrics.jsonl").string();
  std::vector<std::string> args{"--config", (dir / "job.toml").string(), "--metrics-out", metrics, "--timeout", "150"};
  if (steps > 0) {  // else the run ends otherwise (a trace's end)
    args.push_back("--steps");
    args.push_back(std::to_string(steps));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return run_to_end(bin + "/oobleck-local", args, metrics, (dir / "events.jsonl").string(), std::chrono::seconds(170),
                    during);
}

run_summary check_run(const job_case& c, const run_result& run, int steps, const std::set<int>& victims, bool stopped,
                      const std::set<int>& records_lost) {
  using messages::event_kind;
  const run_result r = in_first_ids(run);
  INFO("output of the run:\n" << r.output);
  INFO("events of the run:\n" << describe(r.events));
  run_summary summary;
  REQUIRE(r.status == 0);
  REQUIRE(count(r.events, {.kind = event_kind::stopped}) == 1);
  const auto& stop = stop_of(r.events);
  if (stopped)  // at a trace's end, by oobleck-local: the steps committed so far stand
    CHECK(event_match{.outcome = messages::stop_outcome::shutdown, .committed = r.steps.size() + records_lost.size()}(stop));
  else
    CHECK(finished(static_cast<std::uint64_t>(steps))(stop));
  // (Replicas that disagree after a commit are caught below, from every holder's digest.)

  // Replay the coordinator's decisions through the policy. An epoch_forming event before any epoch
  // formed is a plan of the whole job (the first; or again, after a failure to form it); after
  // that, each one is the policy's decision from the last configuration that formed.
  const planner_model planner(c);
  std::map<std::uint64_t, planning::cluster_state> configuration;  // per formed epoch
  planning::cluster_state formed, forming;
  std::uint64_t forming_epoch = 0;
  bool formed_once = false;
  // Steps whose commit was decided before a loss: the lost node's digests never arrive, and the
  // coordinator records those that did (each node holds a layer in one pipeline at most).
  std::set<int> committed_before_loss;
  for (const auto& e : all_of(r.events, {.kind = event_kind::commit_stood})) committed_before_loss.insert(static_cast<int>(e.step));
  for (const auto& e : r.events) {
    CAPTURE(describe(e));
    if (e.kind == event_kind::node_lost && !formed_once)
      FAIL("a node was lost before the first epoch formed: these checks do not model the plan on the survivors");
    if (e.kind == event_kind::epoch_forming && !formed_once) {
      CHECK(e.lost.empty());
      CHECK(e.joined.empty());
      forming = planner.initial();
      forming_epoch = e.epoch;
    } else if (e.kind == event_kind::epoch_forming) {
      published_reconfiguration pr{ints(e.lost), ints(e.joined), e.detail, e.epoch};
      const auto predicted = planner.lose(formed, pr.lost, pr.joined);
      REQUIRE(continues(predicted));
      CHECK(pr.rules == predicted.reason);
      forming = planner_model::after(predicted);
      forming_epoch = pr.epoch;
      summary.lost.insert(pr.lost.begin(), pr.lost.end());
      if (!pr.lost.empty()) summary.losses.push_back(pr);
      summary.reconfigurations.push_back(std::move(pr));
    } else if (e.kind == event_kind::epoch_formed) {
      CHECK(e.epoch == forming_epoch);
      formed = forming;
      formed_once = true;
      configuration[e.epoch] = formed;
    }
  }
  CHECK(summary.lost == victims);

  // A node that registers while the job trains enters at the next step boundary that another step
  // follows (its node_joined event, then that step's commit), alone or with a loss.
  {
    std::set<int> admitted, due, waiting;
    std::set<std::pair<int, std::string>> registered;  // (node, worker name)
    for (const auto& pr : summary.reconfigurations) admitted.insert(pr.joined.begin(), pr.joined.end());
    bool training = false;
    for (const auto& e : r.events) {
      if (e.kind == event_kind::epoch_forming) training = true;
      // The same node and worker again: it came back to a coordinator that adopted the job (with
      // its state, at its place), not a join. (Without a coordinator loss no node registers twice.)
      const bool again = e.kind == event_kind::node_joined && !registered.insert({static_cast<int>(e.node), e.detail}).second;
      if (e.kind == event_kind::node_joined && training && !again) waiting.insert(static_cast<int>(e.node));
      // With run-ahead, the step after a commit may have gone out with it before the node
      // registered: then it enters after that step, so a boundary with a step after it is one
      // more step away (ARCHITECTURE.md §11).
      if (e.kind == event_kind::step_committed && static_cast<int>(e.step) + 2 < steps) {
        due.insert(waiting.begin(), waiting.end());
        waiting.clear();
      }
    }
    for (int n : due) {
      CAPTURE(n);
      CHECK(admitted.count(n) == 1);
    }
  }

  // The steps: each once, in order, B samples, on the predicted pipelines, equal replicas, and
  // the failure-free run's loss.
  const auto& reference = reference_losses(steps);
  REQUIRE(static_cast<int>(reference.size()) >= steps);
  // Each step once, in order; only a step of `records_lost` may be missing (its record died with
  // the coordinator that decided it).
  std::vector<int> expected_steps;
  for (int k = 0; k < steps; ++k)
    if (!records_lost.count(k) || std::any_of(r.steps.begin(), r.steps.end(), [k](const auto& m) { return m["step"] == k; }))
      expected_steps.push_back(k);
  REQUIRE(r.steps.size() == expected_steps.size());
  const auto layers = static_cast<std::size_t>(c.job.model.num_layers());
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const int k = expected_steps[i];
    const auto& m = r.steps[i];
    CAPTURE(k);
    CAPTURE(m.dump());
    CHECK(m["step"] == k);
    CHECK(m["samples"] == c.job.training.global_batch);
    const auto epoch = m["epoch"].get<std::uint64_t>();
    REQUIRE(configuration.count(epoch) == 1);
    const auto& expected = configuration.at(epoch);
    CAPTURE(describe(expected));
    REQUIRE(m["pipelines"].size() == expected.pipelines.size());
    CHECK(m["pipelines"].size() >= static_cast<std::size_t>(c.job.cluster.fault_tolerance + 1));
    int microbatches = 0;
    std::set<int> used;
    for (std::size_t i = 0; i < expected.pipelines.size(); ++i) {
      const auto& p = m["pipelines"][i];
      std::vector<std::int64_t> expected_nodes;
      for (auto n : expected.pipelines[i].nodes) expected_nodes.push_back(n.value);
      CHECK(p["nodes"].get<std::vector<std::int64_t>>() == expected_nodes);
      CHECK(p["microbatches"].get<int>() == expected.pipelines[i].microbatches);
      microbatches += p["microbatches"].get<int>();
      for (int n : p["nodes"].get<std::vector<int>>()) CHECK(used.insert(n).second);
    }
    CHECK(microbatches * c.job.training.microbatch == c.job.training.global_batch);
    REQUIRE(m["layer_digests"].size() == layers);
    for (const auto& [layer, digests] : m["layer_digests"].items()) {
      CAPTURE(layer);
      if (committed_before_loss.count(k))  // one holder per pipeline, less the lost one
        CHECK((digests.size() == expected.pipelines.size() || digests.size() + 1 == expected.pipelines.size()));
      else
        CHECK(digests.size() == expected.pipelines.size());  // one holder per pipeline
      for (const auto& d : digests) CHECK(d == digests[0]);
    }
    const double want = reference[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
  // Every committed step was published too, once each, in order.
  const auto committed = all_of(r.events, {.kind = event_kind::step_committed});
  REQUIRE(committed.size() == expected_steps.size());
  for (std::size_t i = 0; i < committed.size(); ++i) CHECK(committed[i].step == static_cast<std::uint64_t>(expected_steps[i]));
  // A lost node is in no pipeline of any epoch formed after its loss.
  for (const auto& pr : summary.reconfigurations)
    for (const auto& [epoch, config] : configuration)
      if (epoch >= pr.epoch)
        for (int n : pr.lost) CHECK(pipeline_of(config, n) < 0);

  // The metrics' recovery records: each one is a reconfiguration the events show, with its lost
  // nodes and the policy's rules; at least one whenever nodes were lost; without a loss, only
  // epochs formed again unchanged (a step that failed and ran again).
  // (A coordinator_restored record is a coordinator loss's, which the caller counts.)
  std::vector<nlohmann::json> records;
  for (const auto& e : r.records)
    if (e.value("event", "") != "coordinator_restored") records.push_back(e);
  if (!victims.empty()) CHECK(!records.empty());
  if (victims.empty())
    for (const auto& e : records) CHECK(e["action"] == "unchanged");
  CHECK(records.size() <= summary.reconfigurations.size());
  for (const auto& e : records) {
    CAPTURE(e.dump());
    CHECK(e["event"] == "reconfigured");
    const auto epoch = e["epoch"].get<std::uint64_t>();
    const auto it = std::find_if(summary.reconfigurations.begin(), summary.reconfigurations.end(),
                                 [&](const published_reconfiguration& pr) { return pr.epoch == epoch; });
    REQUIRE(it != summary.reconfigurations.end());
    // One record per recovery (last commit to next): when several reconfigurations happen in
    // between, it lists every node lost and every decision; the epoch's own appear in it.
    const auto lost = e["lost"].get<std::vector<int>>();
    for (int n : it->lost) CHECK(std::find(lost.begin(), lost.end(), n) != lost.end());
    const std::string action = "," + e["action"].get<std::string>() + ",";
    // "unchanged" (e.g. a whole pipeline lost after an earlier loss) is not a decision and is left
    // out of a record that has one (coordinator_forming.cpp, record_reconfiguration).
    CHECK((it->rules.empty() || it->rules == "unchanged" || action.find("," + it->rules + ",") != std::string::npos));
    CHECK(e["resumed_step"].get<int>() < steps);
    CHECK(e["downtime_ms"].get<double>() > 0);
  }
  return summary;
}

checked_run run_faults(const job_case& c, int steps, const std::vector<std::string>& args, const std::set<int>& scheduled,
                       const std::function<void(running_local&)>& during, const std::set<int>& records_lost) {
  auto r = run_local(c, steps, args, during);
  // A fault fired when its node was declared lost: oobleck-local's injector exits 1 when one's node
  // never was; and a node lost without a fault of its own is a failure too.
  const auto fired = lost_nodes(in_first_ids(r));
  INFO("output of the run:\n" << r.output);
  INFO("events of the run:\n" << describe(r.events));
  CHECK_MESSAGE(fired == scheduled, "the nodes lost were " << ids_list({fired.begin(), fired.end()})
                                        << ", the faults were for " << ids_list({scheduled.begin(), scheduled.end()}));
  auto s = check_run(c, r, steps, fired, false, records_lost);
  return {std::move(r), std::move(s)};
}

separate_job::separate_job(const job_case& c, int steps) : tmp_("oobleck-separate-") {
  const auto& dir = tmp_.path();
  write_job(c, dir);
  events_ = (dir / "events.jsonl").string();
  metrics_ = (dir / "metrics.jsonl").string();
  token_ = (dir / "token").string();
  coordinator_ = std::make_unique<background_process>(
      bin + "/oobleck-coordinator",
      std::vector<std::string>{"--listen", "127.0.0.1:0", "--config", (dir / "job.toml").string(), "--token-file", token_,
                               "--steps", std::to_string(steps), "--metrics-out", metrics_, "--events-out", events_,
                               "--address-file", (dir / "address").string()});
  address_ = wait_for_address((dir / "address").string());
}

background_process& separate_job::worker(const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> args{"--coordinator", address_, "--token-file", token_, "--name", name};
  args.insert(args.end(), extra.begin(), extra.end());
  workers_.emplace_back(name, std::make_unique<background_process>(bin + "/oobleck-worker", args));
  return *workers_.back().second;
}

run_result separate_job::finish(std::chrono::seconds timeout, std::map<std::string, int>* worker_status) {
  run_result r;
  try {
    r.status = coordinator_->wait_exit(timeout);
  } catch (...) {
    coordinator_->signal(SIGTERM);
    throw;
  }
  r.output = coordinator_->output();
  r.events = read_event_file(events_);
  read_metrics(metrics_, r);
  for (auto& [name, w] : workers_) {
    const int status = w->wait_exit(std::chrono::seconds(30));
    if (worker_status) (*worker_status)[name] = status;
    r.output += w->output();
  }
  return r;
}

void check_trajectory(const job_case& c, const run_result& r, int steps, const std::set<int>& gone) {
  REQUIRE(r.steps.size() == static_cast<std::size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    const auto& m = r.steps[static_cast<std::size_t>(k)];
    CAPTURE(k);
    CHECK(m["step"] == k);
    CHECK(m["samples"] == c.job.training.global_batch);
    for (const auto& p : m["pipelines"])
      for (const auto& n : p["nodes"]) CHECK(!gone.count(n.get<int>()));
    for (const auto& [layer, digests] : m["layer_digests"].items())
      for (const auto& d : digests) CHECK(d == digests[0]);
    const double want = reference_losses()[static_cast<std::size_t>(k)];
    CHECK(std::abs(m["loss"].get<double>() - want) <= 1e-4 * std::abs(want));
  }
}

}  // namespace oobleck::testing
