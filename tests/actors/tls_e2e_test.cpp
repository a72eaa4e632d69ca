// TLS on the coordinator's CAF port, end to end (issue 23, item 4), with a CA the test makes with
// the openssl tool: a job whose coordinator and workers all use TLS trains to the same losses as
// the single-process run; a worker without TLS, or with a certificate of another CA, cannot join
// a TLS coordinator and says why within seconds while the job goes on; oobleck-ctl gets the status
// with TLS and is refused without; a TLS worker meeting a plain coordinator says so too, given the
// coordinator alone or in a standby list; half a configuration stops every program before it
// listens or connects. That the port really speaks TLS is seen on the wire: a CAF port greets a new connection with its handshake at once, a TLS
// port says nothing until the client's hello. Every wait has a deadline.

#include <doctest/doctest.h>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/stage.hpp"
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "support/apps_dir.hpp"
#include "support/background_process.hpp"
#include "support/job_events.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"
#include "support/tcp_client.hpp"
#include "support/temp_dir.hpp"
#include "support/test_pki.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// oobleck-local's default job (a tiny GPT) with `more` appended (keys of sections it lacks).
std::string default_job_text(const std::string& replace_cluster = "") {
  const auto r = run_process(bin + "/oobleck-local", {"--print-default-job"});
  REQUIRE(r.exit_status == 0);
  std::string text = r.out;
  if (!replace_cluster.empty()) {
    const auto at = text.find("[cluster]");
    REQUIRE(at != std::string::npos);
    text = text.substr(0, at) + replace_cluster;
  }
  return text + "\n[faults]\ndigest_every = 1\n";  // the replicas compared after every step
}

std::vector<std::string> tls_flags(const test_identity& id, const std::string& ca_file) {
  return {"--tls-certificate", id.certificate, "--tls-key", id.key, "--tls-ca-file", ca_file};
}

/// What a new connection to 127.0.0.1:port receives within a second, saying nothing itself.
std::string greeting(std::uint16_t port) {
  tcp_client c(port);
  return c.read_until_closed(std::chrono::seconds(1)).received;
}

std::uint16_t port_of(const std::string& address) {
  return static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

/// The pid of the child of `parent` running `program` (its /proc comm, at most 15 characters), or -1.
pid_t child_running(pid_t parent, const std::string& program) {
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), &::closedir);
  while (const dirent* e = proc ? ::readdir(proc.get()) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && line.substr(open + 1, close - open - 1) == program.substr(0, 15)) return pid;
  }
  return -1;
}

/// Every committed step of `metrics` has the single-process run's loss (1e-4 relative), B samples,
/// and every holder of a layer the same digest.
void check_trajectory(const apps::job_file& job, const std::vector<nlohmann::json>& metrics, int steps) {
  const auto reference = actors::train_single_process(apps::stage_job_for(job), static_cast<std::uint64_t>(steps));
  REQUIRE(metrics.size() == static_cast<std::size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    const auto& m = metrics[static_cast<std::size_t>(k)];
    CHECK(m["step"] == k);
    CHECK(m["samples"] == job.training.global_batch);
    const double loss = m["loss"].get<double>(), expected = reference[static_cast<std::size_t>(k)];
    CHECK(std::abs(loss - expected) <= 1e-4 * std::abs(expected));
    for (const auto& [layer, digests] : m["layer_digests"].items()) {
      CAPTURE(layer);
      for (const auto& d : digests) CHECK(d == digests.front());
    }
  }
}

/// A loopback port this test holds bound and never listens on: a connection there is refused (a
/// standby coordinator not started yet).
struct refused_port {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  std::string address;
  refused_port() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(fd >= 0);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~refused_port() { ::close(fd); }
  refused_port(const refused_port&) = delete;
  refused_port& operator=(const refused_port&) = delete;
};

struct pki_set {
  temp_dir dir{"oobleck-tls-e2e-"};
  test_pki job{dir.path(), "job"};
  test_pki other{dir.path(), "other"};
  [[nodiscard]] std::string path(const std::string& name) const { return (dir.path() / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path(name)) << text; }
};

}  // namespace

TEST_CASE("oobleck-local with [tls] in its job file: every process speaks TLS, the losses are the single-process run's") {
  pki_set p;
  // One identity for every process (any certificate the job's CA signed will do), its key
  // encrypted: the passphrase comes from the job file and reaches the workers through oobleck-local.
  // A worker killed in step 3 (--fail-at: oobleck-local's injector connects over TLS too) is
  // recovered from as without TLS.
  const auto node = p.job.issue("node", "job passphrase");
  const int steps = 6;
  std::filesystem::copy_file(node.certificate, p.path("node.pem"));
  std::filesystem::copy_file(node.key, p.path("node.key"));
  const std::string text = default_job_text() + "\n[tls]\ncertificate = \"node.pem\"\nkey = \"node.key\"\nca_file = \"" +
                           p.job.ca_file() + "\"\npassphrase = \"job passphrase\"\n";
  p.write("job.toml", text);  // relative [tls] files: next to the job file
  const auto job = apps::read_job_file(p.path("job.toml"));
  std::string greeted = "(not probed)";
  const auto r = run_to_end(bin + "/oobleck-local",
                            {"--config", p.path("job.toml"), "--nodes", "5", "--steps", std::to_string(steps),
                             "--fail-at", "3:4", "--metrics-out", p.path("metrics.jsonl")},
                            p.path("metrics.jsonl"), p.path("events.jsonl"), std::chrono::seconds(240),
                            [&](running_local& run) {
                              run.wait_for({.kind = event_kind::epoch_formed}, std::chrono::seconds(120));
                              const pid_t coordinator = child_running(run.process.pid(), "oobleck-coordinator");
                              REQUIRE(coordinator > 0);
                              const auto ports = listening_ports(coordinator);
                              REQUIRE(ports.size() == 1u);
                              greeted = greeting(*ports.begin());
                            });
  INFO(r.output);
  INFO(describe(r.events));
  REQUIRE(r.status == 0);
  CHECK(contains(r.events, finished(steps)));
  CHECK(count(r.events, {.kind = event_kind::node_joined}) == 5u);
  CHECK(count(r.events, {.kind = event_kind::node_lost}) == 1u);
  CHECK(loss_in_step(r.events, 4, 3) < r.events.size());
  CHECK(greeted.empty());  // a TLS port waits for the client's hello
  check_trajectory(job, r.steps, steps);
}

TEST_CASE("a TLS coordinator: workers without TLS or of another CA are refused at once, ctl needs TLS, the job trains") {
  pki_set p;
  const auto coordinator_id = p.job.issue("coordinator");
  const auto worker_id = p.job.issue("worker");
  const auto operator_id = p.job.issue("operator");
  const auto stranger = p.other.issue("stranger");
  const int steps = 5;
  // Two nodes, one pipeline of two stages (n0 = 2 by the slot memory).
  p.write("job.toml", default_job_text("[cluster]\nnodes = 2\nfault_tolerance = 0\ndevice_memory_bytes = 1500000\n"));
  const auto job = apps::read_job_file(p.path("job.toml"));
  const auto events = p.path("events.jsonl");
  std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", p.path("job.toml"), "--token-file",
                                p.path("token"), "--steps", std::to_string(steps), "--events-out", events,
                                "--metrics-out", p.path("metrics.jsonl"), "--address-file", p.path("address")};
  const auto tls = tls_flags(coordinator_id, p.job.ca_file());
  args.insert(args.end(), tls.begin(), tls.end());
  background_process coordinator(bin + "/oobleck-coordinator", args);
  const std::string address = wait_for_address(p.path("address"));
  INFO(coordinator.output());
  CHECK(greeting(port_of(address)).empty());

  auto worker = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> a{"--coordinator", address, "--token-file", p.path("token"), "--name", name,
                               "--connect-timeout", "30"};
    a.insert(a.end(), extra.begin(), extra.end());
    return std::make_unique<background_process>(bin + "/oobleck-worker", a);
  };
  const auto started = std::chrono::steady_clock::now();
  auto plain = worker("plain", {});
  auto foreign = worker("foreign", tls_flags(stranger, p.other.ca_file()));
  // With a standby list (the standby not started): each address gets 1 s at a time, so silence is
  // tried again until the connect timeout, and then named as the single address's is.
  refused_port standby;
  background_process plain_listed(bin + "/oobleck-worker",
                                  {"--coordinator", standby.address + "," + address, "--token-file", p.path("token"),
                                   "--name", "plain-listed", "--connect-timeout", "6"});
  CHECK(foreign->wait_exit(std::chrono::seconds(15)) == 2);
  CHECK(plain->wait_exit(std::chrono::seconds(20)) == 2);
  CHECK(plain_listed.wait_exit(std::chrono::seconds(20)) == 2);
  // Fast: the plain one within its handshake wait (10 s), not its connect timeout (30 s).
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(20));
  INFO(plain->output());
  INFO(foreign->output());
  INFO(plain_listed.output());
  CHECK(has(plain->output(), "error: the coordinator at " + address));
  CHECK(has(plain->output(), "give --tls-certificate, --tls-key and --tls-ca-file"));
  CHECK(has(foreign->output(), "closed the connection during CAF's handshake"));
  CHECK(has(foreign->output(), "both sides must use the job's CA"));
  CHECK(has(plain_listed.output(), "error: the coordinator at " + address));
  CHECK(has(plain_listed.output(), "give --tls-certificate, --tls-key and --tls-ca-file"));

  // oobleck-ctl: refused without TLS, answered with it.
  const std::vector<std::string> ctl_base{"--coordinator", address, "--token-file", p.path("token"), "--connect-timeout", "3"};
  auto ctl = [&](const std::vector<std::string>& extra) {
    auto a = ctl_base;
    a.insert(a.end(), extra.begin(), extra.end());
    a.emplace_back("status");
    return run_process(bin + "/oobleck-ctl", a);
  };
  const auto refused = ctl({});
  CHECK(refused.exit_status == 2);
  CHECK(has(refused.err, "give --tls-certificate, --tls-key and --tls-ca-file"));
  const auto answered = ctl(tls_flags(operator_id, p.job.ca_file()));
  INFO(answered.err);
  CHECK(answered.exit_status == 0);
  CHECK(has(answered.out, "job: "));

  // The real workers join; the job trains to its end as if no stranger had knocked.
  auto w0 = worker("node0", tls_flags(worker_id, p.job.ca_file()));
  auto w1 = worker("node1", tls_flags(worker_id, p.job.ca_file()));
  wait_for_event(events, finished(steps), std::chrono::seconds(180));
  CHECK(coordinator.wait_exit(std::chrono::seconds(30)) == 0);
  CHECK(w0->wait_exit(std::chrono::seconds(30)) == 0);
  CHECK(w1->wait_exit(std::chrono::seconds(30)) == 0);
  const auto all = read_event_file(events);
  INFO(describe(all));
  CHECK(count(all, {.kind = event_kind::node_joined}) == 2u);
  CHECK(!contains(all, {.kind = event_kind::node_lost}));
  local_run metrics;
  read_metrics(p.path("metrics.jsonl"), metrics);
  check_trajectory(job, metrics.steps, steps);
}

TEST_CASE("a TLS worker meeting a coordinator without TLS says so at once, and the plain port greets in the clear") {
  pki_set p;
  const auto worker_id = p.job.issue("worker");
  p.write("job.toml", "[model]\nvocab = 256\n");
  background_process coordinator(bin + "/oobleck-coordinator",
                                 {"--listen", "127.0.0.1:0", "--config", p.path("job.toml"), "--token-file",
                                  p.path("token"), "--steps", "0", "--address-file", p.path("address")});
  const std::string address = wait_for_address(p.path("address"));
  // The control for the TLS checks above: a plain CAF port sends its handshake unasked.
  CHECK(!greeting(port_of(address)).empty());
  const auto started = std::chrono::steady_clock::now();
  background_process w(bin + "/oobleck-worker", [&] {
    std::vector<std::string> a{"--coordinator", address, "--token-file", p.path("token"), "--name", "tls-worker",
                               "--connect-timeout", "30"};
    const auto f = tls_flags(worker_id, p.job.ca_file());
    a.insert(a.end(), f.begin(), f.end());
    return a;
  }());
  // The same worker given a standby list (the standby not started, listed first): the plain
  // coordinator is named as soon as it answered in another way twice, not after --connect-timeout.
  refused_port standby;
  background_process listed(bin + "/oobleck-worker", [&] {
    std::vector<std::string> a{"--coordinator", standby.address + "," + address, "--token-file", p.path("token"),
                               "--name", "tls-worker-listed", "--connect-timeout", "30"};
    const auto f = tls_flags(worker_id, p.job.ca_file());
    a.insert(a.end(), f.begin(), f.end());
    return a;
  }());
  for (auto* worker : {&w, &listed}) {
    const int exit_status = worker->wait_exit(std::chrono::seconds(20));
    INFO(worker->output());
    CHECK(exit_status == 2);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(15));
    // CAF fails the TLS session at once when the plain handshake is already there as TCP connects
    // (the worker then sees it greet in the clear), or else later, when it arrives.
    CHECK((has(worker->output(), "closed the connection during CAF's handshake") ||
           has(worker->output(), "sent CAF's handshake in the clear")));
    CHECK(has(worker->output(), "it runs without TLS"));
  }
  // The coordinator is not disturbed: it still answers an operator.
  const auto status = run_process(bin + "/oobleck-ctl", {"--coordinator", address, "--token-file", p.path("token"), "status"});
  CHECK(status.exit_status == 0);
  coordinator.signal(SIGTERM);
  CHECK(coordinator.wait_exit() == 0);
}

TEST_CASE("half a TLS configuration stops every program before it listens or connects") {
  pki_set p;
  const auto id = p.job.issue("node");
  p.write("job.toml", "[model]\nvocab = 256\n");
  p.write("half.toml", "[model]\nvocab = 256\n[tls]\ncertificate = \"" + id.certificate + "\"\n");
  p.write("token", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n");
  std::filesystem::permissions(p.path("token"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::vector<std::string> half{"--tls-certificate", id.certificate, "--tls-key", id.key};
  struct program {
    std::string name;
    std::vector<std::string> args;
    std::vector<std::string> subcommand;  ///< after the flags
  };
  const std::vector<program> programs{
      {"oobleck-coordinator",
       {"--listen", "127.0.0.1:0", "--config", p.path("job.toml"), "--token-file", p.path("token"), "--steps", "0"}},
      {"oobleck-worker", {"--coordinator", "127.0.0.1:9", "--token-file", p.path("token")}},
      {"oobleck-ctl", {"--coordinator", "127.0.0.1:9", "--token-file", p.path("token")}, {"status"}},
      {"oobleck-local", {"--config", p.path("job.toml"), "--nodes", "1", "--fault-tolerance", "0"}},
  };
  for (const auto& [name, base, subcommand] : programs) {
    CAPTURE(name);
    auto args = base;
    args.insert(args.end(), half.begin(), half.end());
    args.insert(args.end(), subcommand.begin(), subcommand.end());
    const auto r = run_process(bin + "/" + name, args);
    CHECK(r.exit_status == 2);
    CHECK(has(r.err, "TLS needs a certificate, its key and the job's CA together: --tls-certificate, --tls-key given, "
                     "--tls-ca-file"));
    // A file that cannot be read is named with its flag.
    auto unreadable = base;
    const auto f = tls_flags({id.certificate, "/nonexistent/node.key"}, p.job.ca_file());
    unreadable.insert(unreadable.end(), f.begin(), f.end());
    unreadable.insert(unreadable.end(), subcommand.begin(), subcommand.end());
    const auto u = run_process(bin + "/" + name, unreadable);
    CHECK(u.exit_status == 2);
    CHECK(has(u.err, "--tls-key /nonexistent/node.key: cannot read it: No such file or directory"));
  }
  // A job file's half [tls] is refused at its line by the programs that read it.
  const auto c = run_process(bin + "/oobleck-coordinator",
                             {"--listen", "127.0.0.1:0", "--config", p.path("half.toml"), "--token-file", p.path("token")});
  CHECK(c.exit_status == 2);
  CHECK(has(c.err, "half.toml:4: [tls] needs tls.certificate, tls.key and tls.ca_file together"));
}
