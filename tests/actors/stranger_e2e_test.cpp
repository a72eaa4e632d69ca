// A stranger on the control port (issue 23, item 2): while oobleck-local trains a real job, an actor
// system of this test process connects to the coordinator's port with caf::io::remote_actor, as any
// well-formed CAF peer without the job token could, and keeps sending it every node-side message
// with the job's real epochs, steps and node ids (read from the job's events, as /status shows them
// to anyone): faults, readies, pipeline reports that would commit a step, commits, checkpoint
// writes, aborts, stall reports, deadlines; exits (kill), error messages, and floods of nonce
// requests from the moment the port opens, while the workers register. The job must not notice:
// every step committed once, no node lost, no step failed, every worker admitted, and the losses
// equal the failure-free single-process
// run (the checks of recovery_e2e_support.hpp). The coordinator's status, asked with the job's own
// token, shows the refusals, so the stranger did reach it.

#include <doctest/doctest.h>

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/admission.hpp"
#include "actors/recovery_e2e_support.hpp"
#include "messages/actor_interfaces.hpp"
#include "messages/protocol.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using namespace oobleck::messages;
using planning::layer_index;
using planning::node_id;

namespace {

/// The oobleck-coordinator process oobleck-local `parent` started, or -1.
pid_t coordinator_of(pid_t parent) {
  DIR* proc = ::opendir("/proc");
  if (!proc) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    const auto open = line.find('(');
    if (close == std::string::npos || open == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && line.substr(open + 1, close - open - 1).rfind("oobleck-coordin", 0) == 0) {
      found = static_cast<pid_t>(std::stoi(name));
      break;
    }
  }
  ::closedir(proc);
  return found;
}

/// The value after `flag` on process `pid`'s command line ("" when absent).
std::string flag_of(pid_t pid, const std::string& flag) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) return args[i + 1];
  return {};
}

struct stranger_config : caf::actor_system_config {
  stranger_config() {
    add_protocol_types(*this);
    load<caf::io::middleman>();
    set("scheduler.max-threads", 1);
    set("logger.console", caf::atom("none"));
    // Stays connected under the job's heartbeat timeout, like any peer would.
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(100)});
  }
};

/// What the stranger knows of the job: its newest epoch, the step running, its nodes.
struct job_view {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::vector<std::int64_t> nodes;
};

job_view view_of(const std::vector<job_event>& events) {
  job_view v;
  for (const auto& e : events) {
    v.epoch = std::max(v.epoch, e.epoch);
    if (e.kind == event_kind::step_committed) v.step = std::max(v.step, e.step + 1);
    if (e.kind == event_kind::node_joined) v.nodes.push_back(e.node);
  }
  return v;
}

}  // namespace

TEST_CASE("stranger e2e: a CAF peer without the token sends every node-side message, exits and nonce floods: the job does not notice") {
  const auto c = make_job(4, 1, 1'500'000);
  const int steps = 12;
  std::uint64_t rounds = 0;
  std::uint64_t refused_seen = 0;
  std::string stranger_error;
  const auto r = run_local(c, steps, {}, [&](running_local& run) {
    // The coordinator's port and token file, from /proc (the test's own job: the token is only
    // used to ask for the status, as its operator would). The stranger connects as soon as the
    // port is open, so its nonce floods overlap the workers' registrations.
    const auto found_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    pid_t coordinator = -1;
    std::set<std::uint16_t> ports;
    while (ports.empty() && std::chrono::steady_clock::now() < found_by) {
      if (coordinator < 0) coordinator = coordinator_of(run.process.pid());
      if (coordinator > 0) ports = listening_ports(coordinator);
      if (ports.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(coordinator > 0);
    REQUIRE(ports.size() == 1u);
    const std::uint16_t port = *ports.begin();
    const std::string token = actors::read_token_file(flag_of(coordinator, "--token-file"));

    stranger_config cfg;
    caf::actor_system sys{cfg};
    auto coord = sys.middleman().remote_actor<coordinator_actor>("127.0.0.1", port);
    REQUIRE_MESSAGE(coord, sys.render(coord.error()));
    auto stranger = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler(caf::drop);
      return {[](int) {}};
    });
    const auto untyped = caf::actor_cast<caf::actor>(*coord);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
    for (;;) {
      const auto events = run.events_so_far();
      if (std::any_of(events.begin(), events.end(), [](const job_event& e) { return e.kind == event_kind::stopped; }))
        break;
      if (std::chrono::steady_clock::now() > deadline) {
        stranger_error = "the job did not stop within 150 s";
        break;
      }
      const auto v = view_of(events);
      auto send = [&](auto m) { caf::send_as(stranger, *coord, std::move(m)); };
      for (auto n : v.nodes) {
        for (std::uint64_t e : {v.epoch, v.epoch + 1}) {
          send(node_fault{e, node_id{n}, "forged", true});
          send(node_ready{e, node_id{n}, {}});
          send(epoch_aborted{e, node_id{n}});
          std::vector<layer_digest> digests;
          for (int l = 0; l < 4; ++l) digests.push_back({layer_index{l}, 12345});
          send(step_committed{e, v.step, node_id{n}, digests});
          send(stall_report{rounds, node_id{n}, e, false, true, 1e6, 0});
        }
        send(checkpoint_written{1, node_id{n}, {}, {}, "forged"});
      }
      for (int p = 0; p < 4; ++p) send(pipeline_done{v.epoch, v.step, p, 1.0, ""});
      send(coordinator_deadline{deadline_kind::step, v.epoch, v.step, 0});
      for (int i = 0; i < (v.nodes.size() < 4 ? 400 : 50); ++i) send(nonce_request{protocol_version});
      caf::anon_send(untyped, caf::make_error(caf::sec::runtime_error));
      caf::anon_send_exit(untyped, caf::exit_reason::kill);
      caf::send_as(stranger, untyped, caf::exit_msg{untyped.address(), caf::exit_reason::kill});
      ++rounds;
      // Now and then, as the job's operator: the refusals reached the status.
      if (rounds % 25 == 0) {
        caf::scoped_actor op{sys};
        std::string nonce;
        op->request(*coord, std::chrono::seconds(5), nonce_request{protocol_version})
            .receive([&](std::string& n) { nonce = n; }, [](caf::error&) {});
        if (!nonce.empty())
          op->request(*coord, std::chrono::seconds(5), status_atom_v, control_proof{nonce, actors::control_proof_of(token, nonce)})
              .receive([&](job_status& s) { refused_seen = std::max(refused_seen, s.refused_messages); }, [](caf::error&) {});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
  });
  INFO(r.output);
  INFO(describe(r.events));
  CHECK(stranger_error.empty());
  CHECK(rounds >= 20);
  CHECK(refused_seen > 0);
  REQUIRE(r.status == 0);
  CHECK(!contains(r.events, {.kind = event_kind::node_lost}));
  CHECK(!contains(r.events, {.kind = event_kind::step_failed}));
  CHECK(!contains(r.events, {.kind = event_kind::node_refused}));
  // The workers that registered during the nonce flood were all admitted, and every invariant
  // holds: each step once, B samples, replicas agreeing, the failure-free losses.
  CHECK(all_of(r.events, {.kind = event_kind::node_joined}).size() == 4u);
  check_run(c, r, steps, {});
}
