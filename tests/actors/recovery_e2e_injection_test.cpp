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
using messages::event_kind;

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
  INFO(describe(r.events));
  // What oobleck-local tells its user on purpose: the replay it is about to do.
  CHECK(r.output.find("n3 -> worker 2") != std::string::npos);
  CHECK(r.output.find("1 kill(s), 1 worker start(s) (joins); 1 node(s) of the trace never get a worker") !=
        std::string::npos);
  // What happened, from the job's events. Node ids are the coordinator's (order of registration):
  // a replay's starting workers register one at a time, so worker node2 (n3) is node 2; the worker
  // started for n7 (node6) joins as node 6; n8's (node7) is never started.
  CHECK(contains(r.events, {.kind = event_kind::node_joined, .node = 2, .detail = "node2"}));
  CHECK(contains(r.events, {.kind = event_kind::node_joined, .node = 6, .detail = "node6"}));
  CHECK(!contains(r.events, {.kind = event_kind::node_joined, .detail = "node7"}));
  // n3's removal killed node 2 (its only loss), and n7's add came after it.
  CHECK(all_of(r.events, {.kind = event_kind::node_lost}).size() == 1u);
  CHECK(position(r.events, {.kind = event_kind::node_lost, .node = 2}) <
        position(r.events, {.kind = event_kind::node_joined, .node = 6}));
  // The trace's end stopped the job (an orderly stop by oobleck-local, not the end of its steps).
  CHECK(contains(r.events, {.kind = event_kind::stopped, .outcome = messages::stop_outcome::shutdown}));
  const int steps = static_cast<int>(r.steps.size());
  REQUIRE(steps >= 5);
  const auto s = check_run(c, r, steps, {2}, true);
  // The joined node was admitted by a reconfiguration and computed in the steps after it.
  const bool admitted = std::any_of(s.reconfigurations.begin(), s.reconfigurations.end(), [](const published_reconfiguration& pr) {
    return std::find(pr.joined.begin(), pr.joined.end(), 6) != pr.joined.end();
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
  write_job(c, dir);
  const auto metrics = dir / "metrics.jsonl";
  const auto events = (dir / "events.jsonl").string();
  background_process local(bin + "/oobleck-local", {"--config", (dir / "job.toml").string(), "--steps", "8",
                                                    "--metrics-out", metrics.string(), "--timeout", "120",
                                                    "--fail-at", "1:2", "--events-out", events});
  auto count_children = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
      std::string argv0, argv1;
      std::getline(cmd, argv0, '\0');
      std::getline(cmd, argv1, '\0');
      // The workers, not the fork server they are copies of.
      if (argv0.find("oobleck-worker") == std::string::npos || argv1 == "--fork-server") continue;
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
  wait_until([&] { return count(read_event_file(events), {.kind = event_kind::step_committed}) >= 3; },
             "3 committed steps");
  local.signal(SIGCONT);
  const int status = local.wait_exit(std::chrono::seconds(150));
  INFO(local.output());
  const auto happened = read_event_file(events);
  INFO(describe(happened));
  // The kill fired at step 1: node 2 was lost during step 1, or step 0's commit (and oobleck-local,
  // which counts the faults whose node was never lost, exits 0).
  CHECK(loss_in_step(happened, 2, 1) < happened.size());
  CHECK(contains(happened, finished(8)));
  CHECK(status == 0);
}
