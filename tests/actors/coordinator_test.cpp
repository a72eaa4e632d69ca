// The coordinator and monitor actors on CAF's deterministic scheduler: every test reads as a trace
// (send, run, look at the state and the log). Admission runs the real monitor actor against the
// real coordinator; faults are recorded instead of signalling the test process.

#include "actors/coordinator.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/monitor.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;

namespace {

const std::string token(64, 'k');

struct fixture {
  struct config : caf::actor_system_config {
    config() {
      add_protocol_types(*this);
      set("scheduler.policy", caf::atom("testing"));
    }
  };
  config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys};
  std::vector<std::string> coordinator_log;
  coordinator_actor coord;

  explicit fixture(int expected = 2) {
    coordinator_deps d;
    d.policy = {token, "hash-1", protocol_version};
    d.job_toml = "[model]\n";
    d.expected_nodes = expected;
    d.log = [this](const std::string& l) { coordinator_log.push_back(l); };
    coord = sys.spawn(coordinator, std::move(d));
    sched.run();
  }
  ~fixture() {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    for (auto& w : workers) caf::anon_send_exit(w->handle, caf::exit_reason::user_shutdown);
    sched.run();
  }

  struct worker {
    monitor_actor handle;
    std::vector<std::string> log;
    std::vector<inject_fault> faults;
    std::int64_t node = -1;
  };
  std::vector<std::unique_ptr<worker>> workers;  // outlive the actors, whose callbacks they are

  worker* start_worker(const std::string& name, const std::string& tok = token,
                                       const std::string& job_hash = "") {
    auto* w = workers.emplace_back(std::make_unique<worker>()).get();
    monitor_deps d;
    d.coordinator = coord;
    d.token = tok;
    d.name = name;
    d.data = {"127.0.0.1", 5000};
    d.job_hash = job_hash;
    d.log = [w](const std::string& l) { w->log.push_back(l); };
    d.admitted = [w](const admission& a) { w->node = a.node; };
    d.fault = [w](const inject_fault& f) { w->faults.push_back(f); };
    w->handle = sys.spawn(monitor, std::move(d));
    sched.run();
    return w;
  }

  /// Sends a request to the coordinator, runs the system, stores the reply in `out`; returns
  /// "ok" or the error's description.
  template <class Reply, class... Ts>
  std::string ask(Reply& out, Ts&&... xs) {
    auto response = self->request(coord, caf::infinite, std::forward<Ts>(xs)...);
    sched.run();
    std::string result = "no reply";
    response.receive([&](Reply& r) { out = std::move(r); result = "ok"; },
                     [&](caf::error& e) { result = describe(e); });
    return result;
  }

  control_proof operator_proof() {
    std::string nonce;
    REQUIRE(ask(nonce, nonce_request{protocol_version}) == "ok");
    return {nonce, control_proof_of(token, nonce)};
  }

  job_status status() {
    job_status out;
    REQUIRE(ask(out, status_atom_v, operator_proof()) == "ok");
    return out;
  }

  bool alive(const monitor_actor& m) {
    bool down = false;
    self->monitor(m);
    sched.run();
    self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
    self->demonitor(m.address());
    return !down;
  }
};

}  // namespace

TEST_CASE("coordinator: two workers are admitted with distinct ids and the job becomes ready") {
  fixture f(2);
  auto* a = f.start_worker("node-a");
  CHECK(a->node == 0);
  CHECK(f.status().state == "registering");
  auto* b = f.start_worker("node-b", token, "hash-1");
  CHECK(b->node == 1);
  const job_status s = f.status();
  CHECK(s.state == "ready");
  REQUIRE(s.nodes.size() == 2);
  CHECK(s.nodes[0].name == "node-a");
  CHECK(s.nodes[1].state == "registered");
  CHECK(a->log.at(0) == "admitted as node 0");
  CHECK(f.coordinator_log.back() == "ready: 2 node(s) admitted");
}

TEST_CASE("coordinator: a worker with the wrong token or job is refused and the job is undisturbed") {
  fixture f(1);
  auto* good = f.start_worker("node-a");
  auto* bad = f.start_worker("intruder", std::string(64, 'x'));
  CHECK(bad->node == -1);
  REQUIRE_FALSE(bad->log.empty());
  CHECK(bad->log.back().find("refused by the coordinator: bad_proof") != std::string::npos);
  CHECK_FALSE(f.alive(bad->handle));  // the refused monitor stops
  auto* other = f.start_worker("other-job", token, "hash-2");
  CHECK(other->log.back().find("wrong_job") != std::string::npos);
  CHECK(f.coordinator_log.back().find("refused worker 'other-job': wrong_job") != std::string::npos);
  const job_status s = f.status();
  CHECK(s.state == "ready");
  CHECK(s.nodes.size() == 1);
  CHECK(f.alive(good->handle));
}

TEST_CASE("coordinator: a nonce request of another protocol version is refused") {
  fixture f(1);
  std::string nonce;
  CHECK(f.ask(nonce, nonce_request{protocol_version + 1}).rfind("wrong_version", 0) == 0);
}

TEST_CASE("coordinator: operator requests without a valid proof are refused") {
  fixture f(1);
  auto* w = f.start_worker("node-a");
  job_status status;
  CHECK(f.ask(status, status_atom_v, control_proof{"forged", "00"}) ==
        "bad_proof: unknown, expired or reused nonce");
  auto proof = f.operator_proof();
  proof.proof = control_proof_of(std::string(64, 'x'), proof.nonce);
  std::string reply;
  CHECK(f.ask(reply, inject_fault{0, fault_kind::kill, -1, 0}, proof).rfind("bad_proof", 0) == 0);
  CHECK(w->faults.empty());
  // A proof is good once.
  proof = f.operator_proof();
  CHECK(f.ask(status, status_atom_v, proof) == "ok");
  CHECK(f.ask(status, status_atom_v, proof).rfind("bad_proof", 0) == 0);
}

TEST_CASE("coordinator: an injected fault reaches the node's monitor, and unknown nodes are refused") {
  fixture f(1);
  auto* w = f.start_worker("node-a");
  std::string reply;
  CHECK(f.ask(reply, inject_fault{0, fault_kind::hang, -1, 2.5}, f.operator_proof()) == "ok");
  CHECK(reply == "sent hang to node 0 (node-a)");
  REQUIRE(w->faults.size() == 1);
  CHECK(w->faults[0].seconds == 2.5);
  CHECK(f.ask(reply, inject_fault{7, fault_kind::kill, -1, 0}, f.operator_proof()) ==
        "unknown_node: node 7 is not a live node of this job");
}

TEST_CASE("coordinator: a fault for a node that has not joined yet is delivered on its admission") {
  fixture f(2);
  std::string reply;
  CHECK(f.ask(reply, inject_fault{1, fault_kind::kill, 3, 0}, f.operator_proof()) == "ok");
  CHECK(reply == "kill at step 3 for node 1: delivered when it joins");
  // Only a fault for a later step waits; one meant to act now needs a live node.
  CHECK(f.ask(reply, inject_fault{5, fault_kind::kill, -1, 0}, f.operator_proof()).rfind("unknown_node", 0) == 0);
  auto* a = f.start_worker("node-a");
  CHECK(a->faults.empty());
  auto* b = f.start_worker("node-b");
  REQUIRE(b->node == 1);
  REQUIRE(b->faults.size() == 1);
  CHECK(b->faults[0].at_step == 3);
  // The admission first, then the fault: the node knows who it is before anything is asked of it.
  REQUIRE(b->log.size() >= 2);
  CHECK(b->log.at(0) == "admitted as node 1");
  CHECK(f.coordinator_log.end() != std::find(f.coordinator_log.begin(), f.coordinator_log.end(),
                                             "sent kill at step 3 to node 1 (node-b) on its admission"));
}

TEST_CASE("coordinator: a node whose monitor goes down is lost, once, and subscribers hear it") {
  fixture f(2);
  f.start_worker("node-a");
  auto* b = f.start_worker("node-b");
  caf::scoped_actor listener{f.sys};
  std::string reply;
  REQUIRE(f.ask(reply, subscribe_atom_v, caf::actor{listener}, f.operator_proof()) == "ok");
  caf::anon_send_exit(b->handle, caf::exit_reason::kill);
  f.sched.run();
  std::vector<job_event> events;
  bool more = true;
  while (more)
    listener->receive([&](job_event& e) { events.push_back(e); },
                      caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == event_kind::node_lost);
  CHECK(events[0].node == 1);
  const job_status s = f.status();
  CHECK(s.state == "registering");
  CHECK(s.nodes[1].state == "lost");
  CHECK(f.coordinator_log.back() == "waiting for nodes: 1 of 2 admitted");
}

TEST_CASE("coordinator: shutdown stops every monitor") {
  fixture f(1);
  auto* a = f.start_worker("node-a");
  auto* b = f.start_worker("node-b");
  std::string reply;
  CHECK(f.ask(reply, shutdown_atom_v, std::string("done"), f.operator_proof()) == "ok");
  CHECK(reply == "shutting down");
  CHECK_FALSE(f.alive(a->handle));
  CHECK(a->log.back() == "shut down by the coordinator: done");
  CHECK_FALSE(f.alive(b->handle));
}

TEST_CASE("monitor: a monitor whose coordinator is gone says so and stops") {
  fixture f(1);
  auto* a = f.start_worker("node-a");
  caf::anon_send_exit(f.coord, caf::exit_reason::kill);
  f.sched.run();
  CHECK_FALSE(f.alive(a->handle));
  CHECK(a->log.back().find("lost contact with the coordinator") != std::string::npos);
}
