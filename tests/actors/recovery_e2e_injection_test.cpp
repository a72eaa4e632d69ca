// Recovery end to end, oobleck-local's own fault injection (checks: recovery_e2e_support.hpp): a
// trace replayed with --trace, whose removal kills a worker and whose add starts one that joins,
// and a --fail-at fault that fires although oobleck-local itself is frozen as training starts.

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "actors/recovery_e2e_support.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;

TEST_CASE("recovery e2e: a trace replayed with --trace: its removal kills a worker, its add starts one that joins") {
  // A tiny trace written here: six nodes at 0, n3 removed at 1.5 s, n7 added at 3.5 s, n8 added
  // at 15 s (the trace's end; with 6 slots it would wait as a spare). The replay must kill n3's
  // worker (node2), start a worker for n7 (node6) that joins at a step boundary and computes,
  // stop the job at the trace's end, and every invariant of the other runs must hold.
  const auto c = make_job(6, 1, 1'500'000);
  const testing::temp_dir tmp("oobleck-trace-");
  const auto& dir = tmp.path();
  const auto trace = (dir / "trace.csv").string();
  {
    std::ofstream t(trace);
    for (int i = 1; i <= 6; ++i) t << "0,add,n" << i << "\n";
    t << "1500,remove,n3\r\n3500,add,n7\n15000,add,n8\n";  // CRLF tolerated
  }
  const auto r = run_local(c, 0, {"--trace", trace, "--time-scale", "1", "--trace-nodes", "6"});
  INFO(r.output);
  CHECK(r.output.find("n3 -> worker 2") != std::string::npos);
  CHECK(r.output.find("1 kill(s), 1 worker start(s) (joins); 1 node(s) of the trace never get a worker") !=
        std::string::npos);
  CHECK(r.output.find("n3 removed: kill -9 of worker node2") != std::string::npos);
  CHECK(r.output.find("n7 added: started worker node6 (it joins)") != std::string::npos);
  CHECK(r.output.find("the trace ended (trace 15 s): stopping the job") != std::string::npos);
  CHECK(r.output.find("started worker node7") == std::string::npos);  // n8 never gets a slot
  // Node ids are the coordinator's (order of registration): node2's and node6's.
  std::map<std::string, int> id_of;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("[coordinator] node ", 0) == 0 && line.find(" joined: ") != std::string::npos) {
      const auto name_at = line.find(" joined: ") + 9;
      id_of[line.substr(name_at, line.find(' ', name_at) - name_at)] = std::stoi(line.substr(19));
    }
  REQUIRE(id_of.count("node2") == 1);
  REQUIRE(id_of.count("node6") == 1);
  CHECK(id_of.at("node2") == 2);  // a replay's starting workers register one at a time
  CHECK(id_of.at("node6") == 6);  // joined workers take the next ids
  const int steps = static_cast<int>(r.steps.size());
  REQUIRE(steps >= 5);
  const auto s = check_run(c, r, steps, {id_of.at("node2")}, true);
  // The joined node was admitted by a reconfiguration and computed in the steps after it.
  const bool admitted = std::any_of(s.reconfigurations.begin(), s.reconfigurations.end(), [](const logged_reconfiguration& lr) {
    return std::find(lr.joined.begin(), lr.joined.end(), 6) != lr.joined.end();
  });
  CHECK(admitted);
  bool computed = false;
  for (const auto& m : r.steps)
    for (const auto& p : m["pipelines"])
      for (const auto& n : p["nodes"]) computed = computed || n.get<int>() == 6;
  CHECK(computed);
  // The metrics lines carry their commit time: the replay's window can be read from the file.
  for (std::size_t k = 1; k < r.steps.size(); ++k)
    CHECK(r.steps[k]["unix_ms"].get<double>() >= r.steps[k - 1]["unix_ms"].get<double>());
}

// Was a bug: oobleck-local's --fail-at / --hang-at faults could never fire. Its injector armed
// them by requests to the coordinator (which forwards each to the node) racing with training, so
// a job that passed step STEP before the node's stage was armed never fired that fault (seen
// under load: schedule "seed 2: 7 nodes, kills: step 2: 4; step 3: 1; step 5: 2" trained all 6
// steps without a kill). Fixed: the coordinator takes every fault before any worker starts and
// delivers those of a node on its admission, before its first epoch assignment. Here the test
// freezes oobleck-local (where the injector lives; the coordinator and workers are its children
// and go on) from the moment the workers exist until the job has committed 3 steps, with a kill
// asked for step 1: the kill still fires at step 1.
TEST_CASE("recovery e2e: a --fail-at fault fires even when oobleck-local is frozen as training starts") {
  // Generous heartbeats: oobleck-local (its injector's connection) stays frozen for seconds.
  const auto c = make_job(6, 1, 1'500'000, slow_heartbeats);
  const testing::temp_dir tmp("oobleck-late-arm-");
  const auto& dir = tmp.path();
  std::ofstream(dir / "job.toml") << c.text;
  const auto metrics = dir / "metrics.jsonl";
  background_process local(bin + "/oobleck-local", {"--config", (dir / "job.toml").string(), "--steps", "8",
                                                    "--metrics-out", metrics.string(), "--timeout", "120",
                                                    "--fail-at", "1:2"});
  auto count_children = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
      std::string argv0;
      std::getline(cmd, argv0, '\0');
      if (argv0.find("oobleck-worker") == std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      std::getline(stat, line);
      std::istringstream fields(line.substr(line.rfind(')') + 2));
      char state = 0;
      pid_t ppid = 0;
      fields >> state >> ppid;
      n += ppid == local.pid();
    }
    return n;
  };
  auto wait_until = [](const std::function<bool()>& done, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) FAIL("timed out waiting for " << what);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  wait_until([&] { return count_children() == c.nodes; }, "the workers");
  local.signal(SIGSTOP);
  wait_until(
      [&] {
        std::ifstream in(metrics);
        int lines = 0;
        for (std::string l; std::getline(in, l);) ++lines;
        return lines >= 3;
      },
      "3 committed steps");
  local.signal(SIGCONT);
  const int status = local.wait_exit(std::chrono::seconds(150));
  INFO(local.output());
  CHECK(local.output().find("injected fault: kill (step 1)") != std::string::npos);
  CHECK(status == 0);
}
