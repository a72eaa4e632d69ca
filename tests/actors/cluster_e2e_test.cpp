// The cluster programs as separate processes on loopback: admission with the job token, refusals
// that leave the job undisturbed, operator requests through oobleck-ctl, fault injection through
// the node's monitor, and orderly and disorderly ends. Every wait has a deadline.

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "support/background_process.hpp"
#include "support/subprocess.hpp"

using namespace oobleck::testing;

namespace {

const std::string bin = OOBLECK_APPS_DIR;

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

/// A coordinator on a free port; `address` once it listens.
struct coordinator_process {
  std::unique_ptr<background_process> p;
  std::string address;
  coordinator_process(const cluster_dir& d, int nodes, const std::string& steps = "0") {
    p = std::make_unique<background_process>(
        bin + "/oobleck-coordinator",
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--config", d.path("job.toml"),
                                 "--token-file", d.path("token"), "--nodes", std::to_string(nodes),
                                 "--steps", steps});
    const std::string line = p->wait_for_line("listening on ");
    const auto at = line.find("127.0.0.1:");
    address = line.substr(at, line.find(' ', at) - at);
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
  w0->wait_for_line("admitted as node");
  w1->wait_for_line("admitted as node");
  c.p->wait_for_line("ready: 2 node(s) admitted");

  // A worker with another token: refused, exit 2, with the reason on both sides.
  d.write("bad-token", std::string(64, 'b') + "\n");
  std::filesystem::permissions(d.path("bad-token"), std::filesystem::perms::owner_read);
  auto intruder = worker(d, c, "intruder", "bad-token");
  CHECK(intruder->wait_exit() == 2);
  CHECK(intruder->output().find("error: refused by the coordinator: bad_proof") != std::string::npos);
  c.p->wait_for_line("refused worker 'intruder': bad_proof");
  // A worker started for another job: refused.
  auto other = worker(d, c, "other", "token", {"--config", d.path("other.toml")});
  CHECK(other->wait_exit() == 2);
  CHECK(other->output().find("wrong_job") != std::string::npos);
  // A worker of 2 slots for a job of 1 slot per node (cluster.slots_per_node): refused.
  auto wide = worker(d, c, "wide", "token", {"--slots", "2"});
  CHECK(wide->wait_exit() == 2);
  CHECK(wide->output().find("error: refused by the coordinator: wrong_slots: the worker has 2 slot(s), the job's "
                            "nodes have 1 (cluster.slots_per_node); start it with --slots 1") != std::string::npos);
  c.p->wait_for_line("refused worker 'wide': wrong_slots");
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
  CHECK(w0->wait_exit() == 0);
  CHECK(w1->wait_exit() == 0);
  CHECK(w0->output().find("shut down by the coordinator: test over") != std::string::npos);
}

TEST_CASE("cluster: kill-node kills the node's own process and the coordinator marks it lost") {
  cluster_dir d;
  coordinator_process c(d, 2);
  auto w0 = worker(d, c, "w0");
  w0->wait_for_line("admitted as node 0");
  auto w1 = worker(d, c, "w1");
  w1->wait_for_line("admitted as node 1");
  const auto sent = ctl(d, c, {"kill-node", "1"});
  CHECK(sent.exit_status == 0);
  CHECK(sent.out == "sent kill to node 1 (w1)\n");
  CHECK(w1->wait_exit() == 128 + SIGKILL);
  c.p->wait_for_line("node 1 lost: w1");
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

TEST_CASE("cluster: hang-node freezes the node's process until its SIGCONT") {
  cluster_dir d;
  // Generous heartbeats: this test is about the freeze and the wake-up, not the detection (a 1 s
  // freeze plus a slow wake-up on a loaded machine must not reach the default 1.5 s timeout).
  d.write("job.toml", "[cluster]\nheartbeat_interval_ms = 1000\nconnection_timeout_ms = 20000\n");
  coordinator_process c(d, 1);
  auto w0 = worker(d, c, "w0", "token", {"--heartbeat-interval-ms", "1000", "--connection-timeout-ms", "20000"});
  w0->wait_for_line("admitted as node 0");
  CHECK(ctl(d, c, {"hang-node", "0", "--seconds", "1"}).exit_status == 0);
  w0->wait_for_line("injected fault: hang");
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
  w0->wait_for_line("admitted as node 0");
  auto w1 = worker(d, c, "w1", "token", {"--heartbeat-interval-ms", "100", "--connection-timeout-ms", "1000"});
  w1->wait_for_line("admitted as node 1");
  const auto start = std::chrono::steady_clock::now();
  w1->signal(SIGSTOP);  // frozen: its process and its connection stay open, it just says nothing
  c.p->wait_for_line("node 1 lost: w1", std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("a frozen worker was declared lost after " << seconds << " s (timeout 1 s)");
  CHECK(seconds >= 0.9);  // not before the configured silence
  // The healthy worker, idle all along, was not.
  const auto s = status(d, c);
  CHECK(s["nodes"][0]["state"] == "registered");
  CHECK(s["nodes"][1]["state"] == "lost");
}

TEST_CASE("cluster: a worker whose coordinator dies says so and exits 3") {
  cluster_dir d;
  coordinator_process c(d, 1);
  auto w0 = worker(d, c, "w0");
  w0->wait_for_line("admitted as node 0");
  c.p->signal(SIGKILL);
  CHECK(c.p->wait_exit() == 128 + SIGKILL);
  CHECK(w0->wait_exit() == 3);
  CHECK(w0->output().find("lost contact with the coordinator") != std::string::npos);
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
  CHECK(r.err.find("cannot reach the coordinator at 127.0.0.1:1") != std::string::npos);
  std::filesystem::permissions(d.path("tok"), std::filesystem::perms::owner_read | std::filesystem::perms::others_read);
  r = run_process(bin + "/oobleck-ctl", {"--coordinator", "127.0.0.1:1", "--token-file", d.path("tok"), "status"});
  CHECK(r.exit_status == 1);
  CHECK(r.err.find("chmod 600") != std::string::npos);
  for (const char* p : {"oobleck-coordinator", "oobleck-worker", "oobleck-ctl"})
    CHECK(run_process(bin + "/" + p, {"--help"}).exit_status == 0);
}

TEST_CASE("cluster: the coordinator waits for the job's cluster.nodes unless --nodes says otherwise") {
  cluster_dir d;
  d.write("three.toml", "[cluster]\nnodes = 3\n");
  background_process c(bin + "/oobleck-coordinator", {"--listen", "127.0.0.1:0", "--config", d.path("three.toml"),
                                                      "--token-file", d.path("token")});
  CHECK(c.wait_for_line("listening on ").find("waiting for 3 node(s)") != std::string::npos);
  c.signal(SIGTERM);
  CHECK(c.wait_exit() == 0);
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
