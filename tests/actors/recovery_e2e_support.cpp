#include "actors/recovery_e2e_support.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

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

/// The nodes whose injected fault fired in a run (their worker printed "injected fault: ...").
std::set<int> fired_faults(const run_result& r) {
  std::map<std::string, int> id_of;  // worker name -> node id
  std::set<std::string> fired;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    const auto joined = line.find("] node ");
    if (line.rfind("[coordinator] node ", 0) == 0 && line.find(" joined: ") != std::string::npos) {
      const auto name_at = line.find(" joined: ") + 9;
      id_of[line.substr(name_at, line.find(' ', name_at) - name_at)] = std::stoi(line.substr(joined + 7));
    }
    if (line.rfind("[worker ", 0) == 0 && line.find("] injected fault: ") != std::string::npos)
      fired.insert(line.substr(8, line.find(']') - 8));
  }
  std::set<int> out;
  for (const auto& name : fired) out.insert(id_of.at(name));
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
                     const std::function<void(background_process&)>& during) {
  const testing::temp_dir tmp("oobleck-recovery-");
  const auto& dir = tmp.path();
  std::ofstream(dir / "job.toml") << c.text;
  const auto metrics = (dir / "metrics.jsonl").string();
  std::vector<std::string> args{"--config", (dir / "job.toml").string(), "--metrics-out", metrics, "--timeout", "150"};
  if (steps > 0) {  // else the run ends otherwise (a trace's end)
    args.push_back("--steps");
    args.push_back(std::to_string(steps));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return run_to_end(bin + "/oobleck-local", args, metrics, std::chrono::seconds(170), during);
}

std::vector<std::string> coordinator_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  const std::string prefix = "[coordinator] ";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line.substr(prefix.size()));
  return out;
}

run_summary check_run(const job_case& c, const run_result& r, int steps, const std::set<int>& victims, bool stopped) {
  INFO("output of the run:\n" << r.output);
  run_summary summary;
  REQUIRE(r.status == 0);
  if (stopped)
    CHECK(r.output.find("stopping: the coordinator was stopped") != std::string::npos);
  else
    CHECK(r.output.find("training finished: " + std::to_string(steps) + " step(s) committed") != std::string::npos);
  CHECK(r.output.find("ERROR") == std::string::npos);  // the coordinator logs a digest mismatch so

  // Replay the coordinator's decisions through the policy.
  const planner_model planner(c);
  std::map<std::uint64_t, planning::cluster_state> configuration;  // per formed epoch
  planning::cluster_state formed, forming = planner.initial();
  std::uint64_t forming_epoch = 1;
  // Steps whose commit was decided before a loss: the lost node's digests never arrive, and the
  // coordinator records those that did (each node holds a layer in one pipeline at most).
  std::set<int> committed_before_loss;
  for (const auto& line : coordinator_lines(r.output)) {
    const auto at = line.find(" was committed before ");
    if (line.rfind("step ", 0) == 0 && at != std::string::npos) committed_before_loss.insert(std::stoi(line.substr(5, at - 5)));
  }
  for (const auto& line : coordinator_lines(r.output)) {
    CAPTURE(line);
    const std::string reconf = "reconfigured after losing node(s)";
    const std::string admit = "reconfigured to admit node(s)";
    const std::string and_admit = " and admitting node(s)";
    const std::string reform = "re-formed the epoch (";
    if (line.rfind(reconf, 0) == 0 || line.rfind(admit, 0) == 0 || line.rfind(reform, 0) == 0) {
      logged_reconfiguration lr;
      const auto open = line.find(" (");
      auto read_ids = [&](std::size_t from, std::size_t to, std::vector<int>& into) {
        std::istringstream ids(line.substr(from, to - from));
        for (int id; ids >> id;) into.push_back(id);
      };
      if (line.rfind(reconf, 0) == 0) {
        const auto also = line.find(and_admit);
        read_ids(reconf.size(), std::min(open, also), lr.lost);
        if (also < open) read_ids(also + and_admit.size(), open, lr.joined);
      } else if (line.rfind(admit, 0) == 0) {
        read_ids(admit.size(), open, lr.joined);
      }
      const auto comma = line.find(", ", open);
      lr.rules = line.substr(open + 2, comma - open - 2);
      const auto e = line.find("): epoch ");
      REQUIRE(e != std::string::npos);
      lr.epoch = std::stoull(line.substr(e + 9));
      const auto predicted = planner.lose(formed, lr.lost, lr.joined);
      REQUIRE(continues(predicted));
      CHECK(lr.rules == predicted.reason);
      forming = planner_model::after(predicted);
      forming_epoch = lr.epoch;
      summary.lost.insert(lr.lost.begin(), lr.lost.end());
      if (!lr.lost.empty()) summary.losses.push_back(lr);
      summary.reconfigurations.push_back(std::move(lr));
    } else if (line.rfind("epoch ", 0) == 0 && line.find(" formed: ") != std::string::npos) {
      const auto epoch = std::stoull(line.substr(6));
      CHECK(epoch == forming_epoch);
      formed = forming;
      configuration[epoch] = formed;
    }
  }
  CHECK(summary.lost == victims);

  // A node that registers while the job trains enters at the next step boundary that another step
  // follows (the coordinator logs its "step K:" line, then admits it), alone or with a loss.
  {
    std::set<int> admitted, due;
    for (const auto& lr : summary.reconfigurations) admitted.insert(lr.joined.begin(), lr.joined.end());
    std::set<int> waiting;
    for (const auto& line : coordinator_lines(r.output)) {
      if (line.rfind("node ", 0) == 0 && line.find("; it enters at the next step boundary") != std::string::npos)
        waiting.insert(std::stoi(line.substr(5)));
      const auto loss = line.find(": loss ");
      if (line.rfind("step ", 0) == 0 && loss != std::string::npos && std::stoi(line.substr(5, loss - 5)) + 1 < steps) {
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
  REQUIRE(static_cast<int>(r.steps.size()) == steps);
  const auto layers = static_cast<std::size_t>(c.job.model.num_layers());
  for (int k = 0; k < steps; ++k) {
    const auto& m = r.steps[static_cast<std::size_t>(k)];
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
      CHECK(p["nodes"].get<std::vector<int>>() == expected.pipelines[i].nodes);
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
  // A lost node is in no pipeline of any epoch formed after its loss.
  for (const auto& lr : summary.reconfigurations)
    for (const auto& [epoch, config] : configuration)
      if (epoch >= lr.epoch)
        for (int n : lr.lost) CHECK(pipeline_of(config, n) < 0);

  // The metrics' recovery records: each one is a reconfiguration the log shows, with its lost
  // nodes and the policy's rules; at least one whenever nodes were lost.
  CHECK(r.events.empty() == victims.empty());
  CHECK(r.events.size() <= summary.reconfigurations.size());
  for (const auto& e : r.events) {
    CAPTURE(e.dump());
    CHECK(e["event"] == "reconfigured");
    const auto epoch = e["epoch"].get<std::uint64_t>();
    const auto it = std::find_if(summary.reconfigurations.begin(), summary.reconfigurations.end(),
                                 [&](const logged_reconfiguration& lr) { return lr.epoch == epoch; });
    REQUIRE(it != summary.reconfigurations.end());
    // One record per recovery (last commit to next): when several reconfigurations happen in
    // between, it lists every node lost and every decision; the epoch's own appear in it.
    const auto lost = e["lost"].get<std::vector<int>>();
    for (int n : it->lost) CHECK(std::find(lost.begin(), lost.end(), n) != lost.end());
    const std::string action = "," + e["action"].get<std::string>() + ",";
    CHECK((it->rules == "unchanged" || action.find("," + it->rules + ",") != std::string::npos));
    CHECK(e["resumed_step"].get<int>() < steps);
    CHECK(e["downtime_ms"].get<double>() > 0);
  }
  return summary;
}

checked_run run_faults(const job_case& c, int steps, const std::vector<std::string>& args, const std::set<int>& scheduled,
                       const std::function<void(background_process&)>& during) {
  auto r = run_local(c, steps, args, during);
  const auto fired = fired_faults(r);
  INFO("output of the run:\n" << r.output);
  CHECK_MESSAGE(fired == scheduled, "only the faults of node(s) " << ids_list({fired.begin(), fired.end()}) << " of "
                                        << ids_list({scheduled.begin(), scheduled.end()}) << " fired");
  auto s = check_run(c, r, steps, fired);
  return {std::move(r), std::move(s)};
}

}  // namespace oobleck::testing
