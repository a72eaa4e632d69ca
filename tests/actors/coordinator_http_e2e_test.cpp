// oobleck-coordinator's HTTP status endpoint and its CAF port as hostile clients meet them, with
// the real programs on loopback: /status and /metrics answer what oobleck-ctl sees, garbage is
// refused without disturbing the job, a port in use stops the start. What the coordinator did comes
// from its events (--events-out), its CAF address from --address-file and its HTTP port from the
// sockets /proc shows it listening on, never from its log lines. Every wait has a deadline.

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/subprocess.hpp"
#include "support/tcp_client.hpp"

using namespace oobleck::testing;
using oobleck::messages::event_kind;
using namespace std::chrono_literals;

namespace {

struct job_dir {
  std::filesystem::path dir;
  job_dir() {
    dir = std::filesystem::temp_directory_path() /
          ("oobleck-http-" + std::to_string(::getpid()) + "-" + std::to_string(++count));
    std::filesystem::create_directories(dir);
    write("job.toml", "[model]\nvocab = 256\n");
  }
  ~job_dir() { std::filesystem::remove_all(dir); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir / name) << text; }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  static inline int count = 0;
};

/// oobleck-coordinator admitting `nodes` (no training), with its CAF and HTTP ports.
struct coordinator {
  std::unique_ptr<background_process> p;
  std::string address;  // HOST:PORT of CAF
  std::string events;   // its --events-out file
  std::uint16_t caf_port = 0, http_port = 0;
  coordinator(const job_dir& d, int nodes, std::vector<std::string> extra = {"--http", "127.0.0.1:0"}) {
    static int count = 0;
    const std::string tag = std::to_string(count++);
    events = d.path("events" + tag + ".jsonl");
    std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", d.path("job.toml"), "--token-file",
                                  d.path("token"), "--nodes", std::to_string(nodes), "--steps", "0", "--events-out",
                                  events, "--address-file", d.path("address" + tag)};
    args.insert(args.end(), extra.begin(), extra.end());
    p = std::make_unique<background_process>(bin + "/oobleck-coordinator", args);
    address = wait_for_address(d.path("address" + tag));
    caf_port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
    // HTTP is served from before the address file is written: any port it listens on besides CAF's.
    for (auto port : listening_ports(p->pid()))
      if (port != caf_port) http_port = port;
  }
  /// Waits for node `node` to be admitted as `name`.
  void admitted(int node, const std::string& name) const {
    wait_for_event(events, {.kind = event_kind::node_joined, .node = node, .detail = name});
  }
};

std::unique_ptr<background_process> worker(const job_dir& d, const coordinator& c, const std::string& name) {
  return std::make_unique<background_process>(
      bin + "/oobleck-worker", std::vector<std::string>{"--coordinator", c.address, "--token-file", d.path("token"),
                                                        "--name", name, "--connect-timeout", "20"});
}

process_result ctl(const job_dir& d, const coordinator& c, const std::vector<std::string>& command) {
  std::vector<std::string> args{"--coordinator", c.address, "--token-file", d.path("token")};
  args.insert(args.end(), command.begin(), command.end());
  return run_process(bin + "/oobleck-ctl", args);
}

nlohmann::json ctl_status(const job_dir& d, const coordinator& c) {
  const auto r = ctl(d, c, {"status", "--json"});
  REQUIRE_MESSAGE(r.exit_status == 0, r.err);
  return nlohmann::json::parse(r.out);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string random_bytes(std::mt19937& rng, std::size_t n) {
  std::string s(n, '\0');
  for (auto& ch : s) ch = static_cast<char>(rng());
  return s;
}

}  // namespace

TEST_CASE("coordinator http: /status and /metrics show what oobleck-ctl sees, 404 elsewhere, garbage refused") {
  job_dir d;
  coordinator c(d, 2);
  REQUIRE(c.http_port != 0);
  auto w0 = worker(d, c, "w0");
  c.admitted(0, "w0");

  const std::string status = http_get(c.http_port, "/status");
  REQUIRE(starts_with(status, "HTTP/1.1 200 OK\r\n"));
  const auto j = nlohmann::json::parse(http_body(status));
  CHECK(j == ctl_status(d, c));  // the same document as oobleck-ctl status --json
  CHECK(j["state"] == "registering");
  REQUIRE(j["nodes"].size() == 1);
  CHECK(j["nodes"][0]["name"] == "w0");

  const std::string metrics = http_get(c.http_port, "/metrics");
  REQUIRE(starts_with(metrics, "HTTP/1.1 200 OK\r\n"));
  const std::string text = http_body(metrics);
  CHECK(text.find("# TYPE oobleck_epoch gauge\noobleck_epoch 0\n") != std::string::npos);
  CHECK(text.find("# HELP oobleck_committed_steps ") != std::string::npos);
  CHECK(text.find("\noobleck_nodes{state=\"registered\"} 1\n") != std::string::npos);
  CHECK(text.find("\noobleck_job_state{state=\"registering\"} 1\n") != std::string::npos);

  CHECK(starts_with(http_get(c.http_port, "/nope"), "HTTP/1.1 404 Not Found\r\n"));
  CHECK(starts_with(exchange(c.http_port, "DELETE /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").received,
                    "HTTP/1.1 405 Method Not Allowed\r\n"));

  std::mt19937 rng(11);
  for (int trial = 0; trial < 5; ++trial) {
    const auto r = exchange(c.http_port, random_bytes(rng, 2000), 10s);
    CAPTURE(trial);
    CHECK(r.closed_by_peer);
    CHECK((r.received.empty() || starts_with(r.received, "HTTP/1.1 400 Bad Request\r\n")));
  }
  // Still answering, over HTTP and CAF, and still admitting.
  CHECK(starts_with(http_get(c.http_port, "/status"), "HTTP/1.1 200 OK\r\n"));
  auto w1 = worker(d, c, "w1");
  c.admitted(1, "w1");
  CHECK(http_body(http_get(c.http_port, "/metrics")).find("\noobleck_nodes{state=\"registered\"} 2\n") !=
        std::string::npos);
  CHECK(http_body(http_get(c.http_port, "/metrics")).find("\noobleck_job_state{state=\"ready\"} 1\n") !=
        std::string::npos);

  CHECK(ctl(d, c, {"shutdown"}).exit_status == 0);
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);
  CHECK(w1->wait_exit() == 0);
}

TEST_CASE("coordinator http: off unless configured, and the job file's http.port serves on the --listen host") {
  job_dir d;
  coordinator off(d, 1, {});
  CHECK(listening_ports(off.p->pid()) == std::set<std::uint16_t>{off.caf_port});  // CAF's port only
  CHECK(off.http_port == 0);
  off.p->signal(SIGTERM);
  CHECK(off.p->wait_exit() == 0);

  // A free port for the job file: bind one, note it, release it.
  std::uint16_t port = 0;
  {
    coordinator probe(d, 1);
    port = probe.http_port;
    probe.p->signal(SIGTERM);
    CHECK(probe.p->wait_exit() == 0);
  }
  d.write("job.toml", "[model]\nvocab = 256\n[http]\nport = " + std::to_string(port) + "\n");
  coordinator from_job(d, 1, {});
  CHECK(from_job.http_port == port);
  CHECK(starts_with(http_get(port, "/status"), "HTTP/1.1 200 OK\r\n"));
  from_job.p->signal(SIGTERM);
  CHECK(from_job.p->wait_exit() == 0);
}

TEST_CASE("coordinator http: a port in use is exit 2 naming it, and the job that holds it is undisturbed") {
  job_dir d;
  coordinator c(d, 1);
  REQUIRE(c.http_port != 0);
  auto w0 = worker(d, c, "w0");
  c.admitted(0, "w0");
  const std::string taken = "127.0.0.1:" + std::to_string(c.http_port);

  job_dir other;
  auto r = run_process(bin + "/oobleck-coordinator",
                       {"--listen", "127.0.0.1:0", "--config", other.path("job.toml"), "--token-file",
                        other.path("token"), "--steps", "0", "--http", taken, "--address-file", other.path("address")});
  CHECK(r.exit_status == 2);
  CHECK(r.err == "error: --http: cannot serve HTTP on " + taken + ": Address already in use\n");
  CHECK(!std::filesystem::exists(other.path("address")));  // it stopped before CAF listened
  other.write("job.toml", "[http]\nport = " + std::to_string(c.http_port) + "\n");
  r = run_process(bin + "/oobleck-coordinator", {"--listen", "127.0.0.1:0", "--config", other.path("job.toml"),
                                                 "--token-file", other.path("token"), "--steps", "0"});
  CHECK(r.exit_status == 2);
  CHECK(r.err == "error: http.port: cannot serve HTTP on " + taken + ": Address already in use\n");
  r = run_process(bin + "/oobleck-coordinator", {"--listen", "127.0.0.1:0", "--config", other.path("job.toml"),
                                                 "--token-file", other.path("token"), "--http", "127.0.0.1:70000"});
  CHECK(r.exit_status == 2);
  CHECK(r.err == "error: --http: the port must be an integer in 0..65535, got '70000'\n");

  CHECK(starts_with(http_get(c.http_port, "/status"), "HTTP/1.1 200 OK\r\n"));
  CHECK(ctl_status(d, c)["nodes"][0]["state"] == "registered");
  CHECK(ctl(d, c, {"shutdown"}).exit_status == 0);
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);
}

TEST_CASE("coordinator: garbage bytes on its CAF port close that connection, and the job is not disturbed") {
  job_dir d;
  coordinator c(d, 2, {});
  auto w0 = worker(d, c, "w0");
  c.admitted(0, "w0");
  std::mt19937 rng(5);
  for (int trial = 0; trial < 8; ++trial) {
    CAPTURE(trial);
    tcp_client junk(c.caf_port);
    junk.send(random_bytes(rng, 1 + rng() % 4096));
    // CAF greets every client with its handshake, reads a header that is not BASP, and drops
    // the connection.
    CHECK(junk.read_until_closed(10s).closed_by_peer);
  }
  {  // A peer that connects and says nothing holds nothing up either.
    tcp_client silent(c.caf_port);
    const auto s = ctl_status(d, c);
    CHECK(s["state"] == "registering");
    REQUIRE(s["nodes"].size() == 1);
    CHECK(s["nodes"][0]["state"] == "registered");
  }
  auto w1 = worker(d, c, "w1");
  c.admitted(1, "w1");
  CHECK(ctl_status(d, c)["state"] == "ready");
  INFO(describe(read_event_file(c.events)));
  CHECK(!contains(read_event_file(c.events), {.kind = event_kind::node_lost}));
  CHECK(ctl(d, c, {"shutdown"}).exit_status == 0);
  CHECK(c.p->wait_exit() == 0);
  CHECK(w0->wait_exit() == 0);
  CHECK(w1->wait_exit() == 0);
}
