// The cluster programs as separate processes on loopback: admission with the job token, refusals
// that leave the job undisturbed, operator requests through oobleck-ctl, fault injection through
// the node's monitor, and orderly and disorderly ends. What the coordinator did comes from its
// events (--events-out) and its address from --address-file; the programs' output is only read for
// what they tell a user on purpose (errors, exit reasons). Every wait has a deadline.

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/subprocess.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;

namespace {

struct cluster_dir {
  std::filesystem::path dir;
  cluster_dir() {
    dir = std::filesystem::temp_directory_path() /
          ("oobleck-cluster-" + std::to_string(::getpid()) + "-" + std::to_string(++count));
    std::filesystem::create_directories(dir);
    write("job.toml", "[model]\nvocab = 256\n");
    write("other.toml", "[model]\nvocab = 300\n");
  }
  ~cluster_dir() { std::filesystem::remove_all(dir); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  static inline int count = 0;
};

/// A coordinator on a free port; `address` once it listens; its events in `events`.
struct coordinator_process {
  std::unique_ptr<background_process> p;
  std::string address;
  std::string events;
  /// `nodes` 0: no --nodes (the job file's cluster.nodes).
  coordinator_process(const cluster_dir& d, int nodes, const std::string& steps = "0",
                      const std::string& config = "job.toml") {
    static int count = 0;
    const std::string tag = std::to_string(count++);
    events = d.path("events" + tag + ".jsonl");
    std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", d.path(config), "--token-file", d.path("token"),
                                  "--steps", steps, "--events-out", events, "--address-file", d.path("address" + tag)};
    if (nodes > 0) args.insert(args.end(), {"--nodes", std::to_string(nodes)});
    p = std::make_unique<background_process>(bin + "/oobleck-coordinator", args);
    address = wait_for_address(d.path("address" + tag));
  }
  /// Waits for node `node` to be admitted as `name`.
  void admitted(int node, const std::string& name) const {
    wait_for_event(events, {.kind = event_kind::node_joined, .node = node, .detail = name});
  }
};

std::unique_ptr<background_process> worker(const cluster_dir& d, const coordinator_process& c,
                                           const std::string& name,
                                           const std::string& token = "token",
                                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--coordinator", c.address, "--token-file", d.path(token), "--name", name,
                                "--connect-timeout", "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<background_process>(bin + "/oobleck-worker", args);
}

process_result ctl(const cluster_dir& d, const coordinator_process& c,
                   const std::vector<std::string>& command, const std::string& token = "token") {
  std::vector<std::string> args{"--coordinator", c.address, "--token-file", d.path(token)};
  args.insert(args.end(), command.begin(), command.end());
  return run_process(bin + "/oobleck-ctl", args);
}

nlohmann::json status(const cluster_dir& d, const coordinator_process& c) {
  const auto r = ctl(d, c, {"status", "--json"});
  REQUIRE_MESSAGE(r.exit_status == 0, r.err);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("cluster: workers are admitted with the token, others are refused and change nothing") {
  cluster_dir d;
  coordinator_process c(d, 2);
  REQUIRE(std::filesystem::exists(d.path("token")));
  CHECK((std::filesystem::status(d.path("token")).permissions() & std::filesystem::perms::group_read) ==
        std::filesystem::perms::none);
  auto w0 = worker(d, c, "w0");
  auto w1 = worker(d, c, "w1", "token", {"--config", d.path("job.toml")});
  wait_for_event(c.events, {.kind = event_kind::node_joined, .detail = "w0"});
  wait_for_event(c.events, {.kind = event_kind::node_joined, .detail = "w1"});

  // A worker with another token: refused, exit 2, with the reason on both sides (the worker's
  // error is what its user is told on purpose; the coordinator's is its node_refused event).
  d.write("bad-token", std::string(64, 'b') + "\n");
  std::filesystem::permissions(d.path("bad-token"), std::filesystem::perms::owner_read);
  auto intruder = worker(d, c, "intruder", "bad-token");
  CHECK(intruder->wait_exit() == 2);
  CHECK(intruder->output().find("error: refused by the coordinator: bad_proof") != std::string::npos);
  CHECK(wait_for_event(c.events, {.kind = event_kind::node_refused}).detail.rfind("intruder: bad_proof", 0) == 0);
  // A worker started for another job: refused.
  auto other = worker(d, c, "other", "token", {"--config", d.path("other.toml")});
  CHECK(other->wait_exit() == 2);
  CHECK(other->output().find("wrong_job") != std::string::npos);
  // A worker of 2 slots for a job of 1 slot per node (cluster.slots_per_node): refused.
  auto wide = worker(d, c, "wide", "token", {"--slots", "2"});
  CHECK(wide->wait_exit() == 2);
  CHECK(wide->output().find("error: refused by the coordinator: wrong_slots: the worker has 2 slot(s), the job's "
                            "nodes have 1 (cluster.slots_per_node); start it with --slots 1") != std::string::npos);
  {
    const auto refused = all_of(read_event_file(c.events), {.kind = event_kind::node_refused});
    INFO(describe(read_event_file(c.events)));
    REQUIRE(refused.size() == 3);
    CHECK(refused[1].detail.rfind("other: wrong_job", 0) == 0);
    CHECK(refused[2].detail.rfind("wide: wrong_slots", 0) == 0);
    CHECK(count(read_event_file(c.events), {.kind = event_kind::node_joined}) == 2);
  }
  // An operator without the token: refused.
  const auto refused = ctl(d, c, {"status"}, "bad-token");
  CHECK(refused.exit_status == 2);
  CHECK(refused.err.find("bad_proof") != std::string::npos);

  const auto s = status(d, c);
  CHECK(s["state"] == "ready");
  REQUIRE(s["nodes"].size() == 2);
  CHECK(s["nodes"][0]["state"] == "registered");
  CHECK(s["nodes"][1]["state"] == "registered");

  const auto text = ctl(d, c, {"status"});
  CHECK(text.exit_status == 0);
  CHECK(text.out.find("job: ready") != std::string::npos);

  const auto bye = ctl(d, c, {"shutdown", "--reason", "test over"});
  CHECK(bye.exit_status == 0);
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);  // 0: shut down by the coordinator
  CHECK(w1->wait_exit() == 0);
  CHECK(stop_of(read_event_file(c.events)).detail == "test over");
  // What the worker tells its user on purpose: why it stopped.
  CHECK(w0->output().find("shut down by the coordinator: test over") != std::string::npos);
}

TEST_CASE("cluster: kill-node kills the node's own process and the coordinator marks it lost") {
  cluster_dir d;
  coordinator_process c(d, 2);
  auto w0 = worker(d, c, "w0");
  c.admitted(0, "w0");
  auto w1 = worker(d, c, "w1");
  c.admitted(1, "w1");
  const auto sent = ctl(d, c, {"kill-node", "1"});
  CHECK(sent.exit_status == 0);
  CHECK(sent.out == "sent kill to node 1 (w1)\n");
  CHECK(w1->wait_exit() == 128 + SIGKILL);
  wait_for_event(c.events, {.kind = event_kind::node_lost, .node = 1});
  const auto s = status(d, c);
  CHECK(s["state"] == "registering");
  CHECK(s["nodes"][1]["state"] == "lost");
  const auto unknown = ctl(d, c, {"kill-node", "1"});
  CHECK(unknown.exit_status == 2);
  CHECK(unknown.err.find("unknown_node") != std::string::npos);
  c.p->signal(SIGTERM);  // an orderly stop tells the workers
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);
}

TEST_CASE("cluster: error-node makes the node's stage throw in its next step, which runs again") {
  cluster_dir d;
  coordinator_process c(d, 2, "100000");  // trains until it is stopped
  auto w0 = worker(d, c, "w0");
  c.admitted(0, "w0");
  auto w1 = worker(d, c, "w1");
  wait_for_event(c.events, {.kind = event_kind::step_committed, .step = 2}, std::chrono::seconds(60));
  const auto sent = ctl(d, c, {"error-node", "1", "--attempts", "1"});
  CHECK(sent.exit_status == 0);
  CHECK(sent.out == "sent error to node 1 (w1)\n");
  // The node's own failure, named: the epoch is formed again on the same nodes and the step that
  // failed runs again and commits; nobody is lost.
  const auto failed = wait_for_event(c.events, {.kind = event_kind::step_failed, .node = 1}, std::chrono::seconds(60));
  CHECK(failed.detail.find("injected: out of memory") != std::string::npos);
  wait_for_event(c.events, {.kind = event_kind::step_committed, .step = failed.step}, std::chrono::seconds(60));
  wait_for_event(c.events, {.kind = event_kind::step_committed, .step = failed.step + 2}, std::chrono::seconds(60));
  const auto events = read_event_file(c.events);
  CHECK(!contains(events, {.kind = event_kind::node_lost}));
  CHECK(count(events, {.kind = event_kind::step_committed, .step = failed.step}) == 1u);
  const auto bad = ctl(d, c, {"error-node", "7"});
  CHECK(bad.exit_status == 2);
  CHECK(bad.err.find("unknown_node") != std::string::npos);
  c.p->signal(SIGTERM);
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);
  CHECK(w1->wait_exit() == 0);
}

TEST_CASE("cluster: hang-node freezes the node's process until its SIGCONT") {
  cluster_dir d;
  // Generous heartbeats: this test is about the freeze and the wake-up, not the detection (a 1 s
  // freeze plus a slow wake-up on a loaded machine must not reach the default 1.5 s timeout).
  d.write("job.toml", "[cluster]\nheartbeat_interval_ms = 1000\nconnection_timeout_ms = 20000\n");
  coordinator_process c(d, 1);
  auto w0 = worker(d, c, "w0", "token", {"--heartbeat-interval-ms", "1000", "--connection-timeout-ms", "20000"});
  c.admitted(0, "w0");
  CHECK(ctl(d, c, {"hang-node", "0", "--seconds", "1"}).exit_status == 0);
  // Frozen: the kernel shows its process stopped (SIGSTOP) until its helper wakes it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (process_state(w0->pid()) != 'T') {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "the worker never froze; output:\n" << w0->output());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // Frozen, then woken by its helper: it still answers the coordinator's shutdown.
  CHECK(ctl(d, c, {"shutdown"}).exit_status == 0);
  CHECK(w0->wait_exit() == 0);
  CHECK(c.p->wait_exit() == 0);
}

TEST_CASE("cluster: a hung worker is declared lost by the heartbeat timeout") {
  cluster_dir d;
  d.write("job.toml", "[cluster]\nheartbeat_interval_ms = 100\nconnection_timeout_ms = 1000\n");
  coordinator_process c(d, 2);
  auto w0 = worker(d, c, "w0", "token", {"--heartbeat-interval-ms", "100", "--connection-timeout-ms", "1000"});
  c.admitted(0, "w0");
  auto w1 = worker(d, c, "w1", "token", {"--heartbeat-interval-ms", "100", "--connection-timeout-ms", "1000"});
  c.admitted(1, "w1");
  const auto start = std::chrono::steady_clock::now();
  w1->signal(SIGSTOP);  // frozen: its process and its connection stay open, it just says nothing
  wait_for_event(c.events, {.kind = event_kind::node_lost, .node = 1}, std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("a frozen worker was declared lost after " << seconds << " s (timeout 1 s)");
  CHECK(seconds >= 0.9);  // not before the configured silence
  // The healthy worker, idle all along, was not.
  const auto s = status(d, c);
  CHECK(s["nodes"][0]["state"] == "registered");
  CHECK(s["nodes"][1]["state"] == "lost");
}

TEST_CASE("cluster: a worker whose coordinator dies and does not come back within its grace says so and exits 3") {
  cluster_dir d;
  coordinator_process c(d, 1);
  auto w0 = worker(d, c, "w0", "token", {"--coordinator-grace", "2"});
  c.admitted(0, "w0");
  c.p->signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  CHECK(c.p->wait_exit() == 128 + SIGKILL);
  CHECK(w0->wait_exit() == 3);  // 3: lost contact with the coordinator, and none came back
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  CHECK(waited >= 1.9);  // it kept its state and looked for a coordinator for the grace period
  // What the worker tells its user on purpose.
  CHECK(w0->output().find("lost contact with the coordinator") != std::string::npos);
  CHECK(w0->output().find("no coordinator came back within") != std::string::npos);
}

TEST_CASE("cluster: bad flags and unreachable coordinators are one clear error") {
  cluster_dir d;
  auto r = run_process(bin + "/oobleck-coordinator", {"--listen", "127.0.0.1", "--config", d.path("job.toml")});
  CHECK(r.exit_status == 2);
  CHECK(r.err == "error: --listen: expected HOST:PORT, got '127.0.0.1'\n");
  d.write("tok", std::string(64, 't') + "\n");
  std::filesystem::permissions(d.path("tok"), std::filesystem::perms::owner_read);
  r = run_process(bin + "/oobleck-worker", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"),
                                            "--connect-timeout", "0.5"});
  CHECK(r.exit_status == 1);
  // Not "internal:": nothing failed in the program.
  CHECK(r.err.rfind("error: cannot reach the coordinator at 127.0.0.1:1", 0) == 0);
  r = run_process(bin + "/oobleck-ctl", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"),
                                         "--connect-timeout", "0.5", "status"});
  CHECK(r.exit_status == 1);
  CHECK(r.err.rfind("error: cannot reach the coordinator at 127.0.0.1:1 within 0.5 s (--connect-timeout): ", 0) == 0);
  // --device: the forms it takes, and CUDA only in a CUDA build, refused before anything starts.
  r = run_process(bin + "/oobleck-worker", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"), "--device", "gpu"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("--device: device 'gpu' is not one of cpu, cuda, cuda:N") != std::string::npos);
#ifndef OOBLECK_WITH_CUDA
  r = run_process(bin + "/oobleck-worker", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"), "--device", "cuda:1"});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("--device cuda:1: this build has no CUDA support") != std::string::npos);
  // An NCCL data plane: the coordinator draws every epoch's id, which needs NCCL.
  d.write("nccl.toml", "[cluster]\ndevice = \"cuda\"\ndata_plane = \"nccl\"\n");
  r = run_process(bin + "/oobleck-coordinator", {"--listen", "127.0.0.1:0", "--config", d.path("nccl.toml")});
  CHECK(r.exit_status == 2);
  CHECK(r.err.find("cluster.data_plane \"nccl\": the coordinator draws every epoch's NCCL id: this build has no CUDA "
                   "support") != std::string::npos);
#endif
  std::filesystem::permissions(d.path("tok"), std::filesystem::perms::owner_read | std::filesystem::perms::others_read);
  r = run_process(bin + "/oobleck-ctl", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"), "status"});
  CHECK(r.exit_status == 2);  // bad input, not an internal error
  CHECK(r.err.find("chmod 600") != std::string::npos);
  for (const char* p : {"oobleck-coordinator", "oobleck-worker", "oobleck-ctl"})
    CHECK(run_process(bin + "/" + p, {"--help"}).exit_status == 0);
}

TEST_CASE("cluster: the coordinator waits for the job's cluster.nodes unless --nodes says otherwise") {
  cluster_dir d;
  d.write("three.toml", "[cluster]\nnodes = 3\n");
  coordinator_process c(d, 0, "0", "three.toml");
  // Two workers are not enough: it still registers; the third makes it ready.
  std::vector<std::unique_ptr<background_process>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(worker(d, c, "w" + std::to_string(i)));
    c.admitted(i, "w" + std::to_string(i));
    CHECK(status(d, c)["state"] == (i < 2 ? "registering" : "ready"));
  }
  c.p->signal(SIGTERM);
  CHECK(c.p->wait_exit() == 0);
  for (auto& w : workers) CHECK(w->wait_exit() == 0);
  // A job the cluster cannot run is refused before anything listens, naming the line.
  d.write("bad.toml", "[cluster]\nfault_tolerance = 1\nnodes = 1\n");
  const auto r = run_process(bin + "/oobleck-coordinator",
                             {"--listen", "127.0.0.1:0", "--config", d.path("bad.toml"), "--token-file", d.path("token")});
  CHECK(r.exit_status == 2);
  CHECK(r.err == "error: " + d.path("bad.toml") +
                     ":3: cluster.nodes 1 cannot hold cluster.fault_tolerance + 1 = 2 pipelines\n");
}

TEST_CASE("cluster: workers that trained exit when the job ends, every time") {
  // A worker used to hang in its actor system's destructor after training (its stage actor ended
  // but stayed referenced), 1 run in 2 to 4 of this very job.
  for (int run = 0; run < 4; ++run) {
    CAPTURE(run);
    cluster_dir d;
    d.write("job.toml",
            "[model]\nblocks = 2\nd_model = 32\nheads = 2\nseq_len = 16\n[data]\ncorpus_bytes = 65536\n"
            "[training]\nsteps = 3\nglobal_batch = 8\nmicrobatch = 2\n[cluster]\nnodes = 2\n");
    coordinator_process cp(d, 2, "3");
    auto w0 = worker(d, cp, "w0");
    auto w1 = worker(d, cp, "w1");
    CHECK(cp.p->wait_exit(std::chrono::seconds(60)) == 0);
    CHECK(w0->wait_exit(std::chrono::seconds(20)) == 0);
    CHECK(w1->wait_exit(std::chrono::seconds(20)) == 0);
  }
}
