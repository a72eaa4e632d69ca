// oobleck-local's own processes: every one it started is gone when it returns or is killed, on
// every way out (--timeout, a replacement coordinator, SIGKILL of oobleck-local itself, SIGINT
// before the job runs, a worker that cannot start), and what it tells a user about them (the
// rest of oobleck-local end to end: local_training_e2e_test.cpp).

#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/job_file.hpp"
#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

TEST_CASE("oobleck-local: --timeout stops every process and returns") {
  // It used to print its error and then wait for ever on the coordinator's output.
  const auto started = std::chrono::steady_clock::now();
  const auto r = run_process(bin + "/oobleck-local", {"--nodes", "4", "--steps", "1000000", "--timeout", "6"});
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  CHECK(r.exit_status == 1);
  CHECK(r.err.find("error: the job did not finish within 6 s") != std::string::npos);
  CHECK(took < 60);
}

TEST_CASE("oobleck-local: --timeout after a replacement coordinator started stops it too and returns") {
  // It used to print its error and then wait for ever: the replacement's output was read to its
  // end before the replacement was stopped.
  testing::background_process local(bin + "/oobleck-local",
                                    {"--steps", "1000000", "--kill-coordinator-at", "3", "--timeout", "12"});
  int status = -1;
  CHECK_NOTHROW(status = local.wait_exit(std::chrono::seconds(60)));
  INFO(local.output());
  CHECK(status == 1);
  CHECK(local.output().find("starting a replacement") != std::string::npos);
  CHECK(local.output().find("error: the job did not finish within 12 s") != std::string::npos);
}

TEST_CASE("oobleck-local: killed with SIGKILL, its coordinator and workers end with it") {
  // They used to go on: the workers waited a minute for a coordinator that never came back.
  const testing::temp_dir tmp("oobleck-local-killed-");
  const std::string events = (tmp.path() / "events.jsonl").string();
  testing::background_process local(bin + "/oobleck-local",
                                    {"--steps", "1000000", "--timeout", "120", "--events-out", events});
  wait_for_event(events, {.kind = event_kind::step_committed, .step = 2}, std::chrono::seconds(60));
  const auto started = children_of(local.pid());
  const int nodes =
      apps::parse_job(run_process(bin + "/oobleck-local", {"--print-default-job"}).out, "default job").cluster.nodes;
  CHECK(started.size() == 2 + static_cast<std::size_t>(nodes));  // the coordinator, the fork server, the workers
  // Its workers start with OpenBLAS on one thread (no pool of spinning threads at load), unless
  // the environment oobleck-local was given says otherwise. They are copies of one oobleck-worker,
  // its fork server, and oobleck-local's own children, each showing its own arguments.
  const char* given = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string expected = std::string("OPENBLAS_NUM_THREADS=") + (given != nullptr ? given : "1");
  int workers = 0, servers = 0;
  for (const pid_t p : started) {
    std::error_code ec;
    if (std::filesystem::read_symlink("/proc/" + std::to_string(p) + "/exe", ec).filename() != "oobleck-worker")
      continue;
    std::ifstream in("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    std::vector<std::string> env;
    for (std::string entry; std::getline(in, entry, '\0');) env.push_back(entry);
    CHECK(std::count(env.begin(), env.end(), expected) == 1);
    const auto argv = command_line(p);
    REQUIRE(argv.size() >= 2);
    if (argv[1] == "--fork-server") {
      ++servers;
    } else {
      ++workers;
      CHECK(std::find(argv.begin(), argv.end(), "--name") != argv.end());
    }
  }
  CHECK(servers == 1);
  CHECK(workers == nodes);
  local.signal(SIGKILL);
  CHECK(local.wait_exit(std::chrono::seconds(10)) == 128 + SIGKILL);
  auto alive = [&] {
    return std::count_if(started.begin(), started.end(), [](pid_t p) {
      const char state = process_state(p);
      return state != 0 && state != 'Z';
    });
  };
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (alive() > 0 && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(alive() == 0);
  for (pid_t p : started) ::kill(p, SIGKILL);  // (when the check above failed)
}

TEST_CASE("oobleck-local: --no-fork-server starts every worker as a program of its own") {
  const testing::temp_dir tmp("oobleck-local-no-fork-");
  const std::string events = (tmp.path() / "events.jsonl").string();
  testing::background_process local(bin + "/oobleck-local",
                                    {"--nodes", "2", "--fault-tolerance", "0", "--steps", "1000000", "--timeout", "120",
                                     "--events-out", events, "--no-fork-server"});
  wait_for_event(events, {.kind = event_kind::step_committed, .step = 2}, std::chrono::seconds(60));
  int workers = 0, servers = 0;
  for (const pid_t p : children_of(local.pid())) {
    const auto argv = command_line(p);
    if (argv.size() < 2 || argv[0].find("oobleck-worker") == std::string::npos) continue;
    ++(argv[1] == "--fork-server" ? servers : workers);
  }
  CHECK(servers == 0);
  CHECK(workers == 2);
  local.signal(SIGTERM);
  CHECK(local.wait_exit(std::chrono::seconds(30)) == 0);
}

TEST_CASE("oobleck-local: a fork server that cannot serve says why, and the workers start as programs") {
  // OpenBLAS on two threads starts one at load: a fork of that process would lack it.
  const auto r = run_process("/usr/bin/env", {"OPENBLAS_NUM_THREADS=2", bin + "/oobleck-local", "--nodes", "2",
                                              "--fault-tolerance", "0", "--steps", "3", "--timeout", "120"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 0);
  const std::string all = r.out + r.err;
  CHECK(all.find("[local] cannot start a fork server of ") != std::string::npos);
  CHECK(all.find("threads before its main") != std::string::npos);
  CHECK(all.find("every worker starts as a program of its own") != std::string::npos);
  CHECK(all.find("training finished: 3 step(s) committed") != std::string::npos);
}

TEST_CASE("oobleck-local: a fork server killed mid-job: the next workers start as programs, and the job goes on") {
  const testing::temp_dir tmp("oobleck-local-server-killed-");
  const std::string events = (tmp.path() / "events.jsonl").string();
  // 200 steps after the join (~1.6 s at 8 ms a step): a worker started as a program
  // (--no-fork-server) registered ~340 ms after step 100 on a fast machine, where the 50 steps
  // after it of the test's first version took ~590 ms; here it first finds its server dead.
  testing::background_process local(bin + "/oobleck-local", {"--nodes", "2", "--fault-tolerance", "0", "--steps", "300",
                                                             "--join-at", "100:1", "--timeout", "120", "--events-out", events});
  wait_for_event(events, {.kind = event_kind::step_committed, .step = 1}, std::chrono::seconds(60));
  pid_t server = -1;
  for (const pid_t p : children_of(local.pid())) {
    const auto argv = command_line(p);
    if (argv.size() >= 2 && argv[1] == "--fork-server") server = p;
  }
  REQUIRE(server > 0);
  ::kill(server, SIGKILL);
  CHECK(local.wait_exit(std::chrono::seconds(90)) == 0);
  INFO(local.output());
  CHECK(local.output().find("its fork server does not answer") != std::string::npos);
  CHECK(local.output().find("this worker and every later one start as programs of their own") != std::string::npos);
  CHECK(local.output().find("training finished: 300 step(s) committed") != std::string::npos);
  // The worker started after the kill joined the job.
  CHECK(count(read_event_file(events), {.kind = event_kind::node_joined, .node = 2}) == 1);
}

TEST_CASE("oobleck-local: SIGINT before the job runs stops it, saying so") {
  // It used to say "the coordinator did not start listening" and exit 1. Here the coordinator is a
  // copy that never listens, so oobleck-local is still waiting for it when the signal comes.
  const testing::temp_dir tmp("oobleck-local-sigint-");
  std::filesystem::copy_file(bin + "/oobleck-local", tmp.path() / "oobleck-local");
  std::ofstream(tmp.path() / "oobleck-coordinator") << "#!/bin/sh\nexec sleep 60\n";
  std::filesystem::permissions(tmp.path() / "oobleck-coordinator", std::filesystem::perms::owner_all);
  testing::background_process local((tmp.path() / "oobleck-local").string(), {"--timeout", "120"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  REQUIRE(children_of(local.pid()).size() == 1);  // the coordinator, waited for
  local.signal(SIGINT);
  int status = -1;
  CHECK_NOTHROW(status = local.wait_exit(std::chrono::seconds(30)));
  INFO(local.output());
  CHECK(status == 128 + SIGINT);
  CHECK(local.output().find("error: stopped by SIGINT while waiting for the coordinator to listen") != std::string::npos);
}

TEST_CASE("oobleck-local: more worker slots than cores are said to share them, the prediction being per core") {
  const std::string line = "worker slot(s) share this machine's";
  cpu_set_t all;
  REQUIRE(::sched_getaffinity(0, sizeof all, &all) == 0);
  const int cores = CPU_COUNT(&all);
  if (cores >= 2) {  // 2 slots on 2 cores or more: nothing to say
    const auto r = run_process(bin + "/oobleck-local", {"--nodes", "2", "--fault-tolerance", "0", "--steps", "2"});
    CHECK(r.exit_status == 0);
    CHECK(r.out.find(line) == std::string::npos);
  }
  // The programs this thread starts inherit its affinity: one core for the 2 slots.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  const auto r = run_process(bin + "/oobleck-local", {"--nodes", "2", "--fault-tolerance", "0", "--steps", "2"});
  REQUIRE(::sched_setaffinity(0, sizeof all, &all) == 0);
  INFO(r.out);
  CHECK(r.exit_status == 0);
  CHECK(r.out.find("2 " + line + " 1 core(s)") != std::string::npos);
}

TEST_CASE("oobleck-local: a worker that cannot start stops the job at once, naming it") {
  // It used to wait for the worker until --timeout (600 s by default). Here the programs are
  // copies beside an oobleck-worker that exits at once (as one that cannot load or is refused).
  const testing::temp_dir tmp("oobleck-local-broken-worker-");
  for (const char* p : {"oobleck-local", "oobleck-coordinator"})
    std::filesystem::copy_file(bin + "/" + p, tmp.path() / p);
  std::ofstream(tmp.path() / "oobleck-worker") << "#!/bin/sh\necho 'cannot start' >&2\nexit 7\n";
  std::filesystem::permissions(tmp.path() / "oobleck-worker", std::filesystem::perms::owner_all);
  const auto started = std::chrono::steady_clock::now();
  const auto r = run_process((tmp.path() / "oobleck-local").string(), {"--nodes", "4", "--steps", "5", "--timeout", "120"});
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO(r.out);
  INFO(r.err);
  CHECK(r.exit_status == 1);
  // Every worker exits at once: whichever oobleck-local reaps first is the one it names.
  const auto named = r.err.find("error: worker node");
  REQUIRE(named != std::string::npos);
  CHECK(r.err.find(" exited with status 7 before it registered (its output is above); stopping the job", named) !=
        std::string::npos);
  CHECK(took < 30);
}
