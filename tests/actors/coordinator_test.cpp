// The coordinator and monitor actors on CAF's deterministic scheduler (fixture: protocol_fixture.hpp):
// every test reads as a trace (send, run, look at the state and the events). Admission runs the
// real monitor actor against the real coordinator; faults are recorded instead of signalling the
// test process.

#include <doctest/doctest.h>

#include <algorithm>

#include <caf/event_based_actor.hpp>

#include "actors/protocol_fixture.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;
using namespace oobleck::testing;

namespace {

/// A worker that cannot run stages (admission, faults and status only).
fixture::worker& start_worker(fixture& f, const std::string& name, const std::string& tok = fixture::token,
                              const std::string& job_hash = "") {
  auto& w = f.add_worker({.name = name, .token = tok, .job_hash = job_hash, .stages = false});
  f.sched.run();
  return w;
}

/// A coordinator over a connection whose route CAF lost (apps/coordinator_link.hpp): it receives
/// nonce requests and never answers them.
caf::actor silent_coordinator(fixture& f) {
  return f.sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[self](nonce_request&) { return self->make_response_promise<std::string>(); }};
  });
}

/// A worker that registers first with `silent` and looks for a coordinator when that fails (it
/// finds the fixture's).
fixture::worker_options late_worker(const caf::actor& silent) {
  return {.name = "late", .stages = false, .first_coordinator = caf::actor_cast<coordinator_actor>(silent),
          .finds_coordinator = true};
}

}  // namespace

TEST_CASE("coordinator: two workers are admitted with distinct ids and the job becomes ready") {
  fixture f({.nodes = 2});
  auto& a = start_worker(f, "node-a");
  CHECK(a.node == 0);
  CHECK(f.status().state == "registering");
  auto& b = start_worker(f, "node-b", fixture::token, "hash");
  CHECK(b.node == 1);
  const job_status s = f.status();
  CHECK(s.state == "ready");
  REQUIRE(s.nodes.size() == 2);
  CHECK(s.nodes[0].name == "node-a");
  CHECK(s.nodes[1].state == "registered");
  CHECK(a.trace == std::vector<std::string>{"admitted 0"});
  INFO(describe(f.events));
  const auto joined = all_of(f.events, {.kind = event_kind::node_joined});
  REQUIRE(joined.size() == 2);
  CHECK(event_match{.node = 0, .detail = "node-a"}(joined[0]));
  CHECK(event_match{.node = 1, .detail = "node-b"}(joined[1]));
}

TEST_CASE("coordinator: an NCCL job refuses a second worker on one GPU of one host, saying whose it is") {
  for (const bool nccl : {true, false}) {
    CAPTURE(nccl);
    fixture f({.nodes = 4, .one_gpu_per_worker = nccl});
    auto add = [&](const std::string& name, std::int32_t gpu, const std::string& host) -> fixture::worker& {
      auto& w = f.add_worker({.name = name, .device_index = gpu, .data_host = host, .stages = false});
      f.sched.run();
      return w;
    };
    CHECK(add("a", 0, "10.0.0.1").node == 0);
    auto& twin = add("twin", 0, "10.0.0.1");  // GPU 0 of the same host
    CHECK(add("b", 1, "10.0.0.1").node >= 0);
    CHECK(add("c", 0, "10.0.0.2").node >= 0);  // GPU 0 of another host
    const auto refusals = all_of(f.events, {.kind = event_kind::node_refused});
    if (!nccl) {
      // The host transport: workers share a GPU.
      CHECK(twin.node == 1);
      CHECK(refusals.empty());
      continue;
    }
    CHECK(twin.node == -1);
    REQUIRE(refusals.size() == 1);
    CHECK(refusals[0].detail ==
          "twin: wrong_device: GPU 0 of 10.0.0.1 is node 0's ('a'), and cluster.data_plane \"nccl\" takes one GPU per "
          "worker: start it with --device cuda:N of another GPU");
    CHECK(f.status().state == "registering");  // 3 of 4
  }
}

TEST_CASE("coordinator: a worker with the wrong token or job is refused and the job is undisturbed") {
  fixture f({.nodes = 1});
  auto& good = start_worker(f, "node-a");
  // The monitor of a refused worker stops, with the coordinator's reason.
  auto refused_reason = [&](const std::string& name, const std::string& tok, const std::string& job_hash) {
    auto& w = f.add_worker({.name = name, .token = tok, .job_hash = job_hash, .stages = false});
    f.self->monitor(w.handle);
    f.sched.run();
    CHECK(w.node == -1);
    std::string reason = "(still running)";
    f.self->receive([&](caf::down_msg& dm) { reason = describe(dm.reason); },
                    caf::after(std::chrono::seconds(0)) >> [] {});
    return reason;
  };
  CHECK(refused_reason("intruder", std::string(64, 'x'), "").rfind("bad_proof", 0) == 0);
  CHECK(refused_reason("other-job", fixture::token, "hash-2").rfind("wrong_job", 0) == 0);
  INFO(describe(f.events));
  const auto refusals = all_of(f.events, {.kind = event_kind::node_refused});
  REQUIRE(refusals.size() == 2);
  CHECK(refusals[0].detail.rfind("intruder: bad_proof", 0) == 0);
  CHECK(refusals[1].detail.rfind("other-job: wrong_job", 0) == 0);
  CHECK(count(f.events, {.kind = event_kind::node_joined}) == 1);
  // What the refused worker tells its user on purpose (oobleck-worker prints it as its error).
  REQUIRE_FALSE(f.workers.at(1)->log.empty());
  CHECK(f.workers.at(1)->log.back().find("refused by the coordinator: bad_proof") != std::string::npos);
  const job_status s = f.status();
  CHECK(s.state == "ready");
  CHECK(s.nodes.size() == 1);
  CHECK(f.alive(good.handle));
}

TEST_CASE("monitor: a worker that loses its coordinator before it was admitted looks for one and registers there") {
  // Its coordinator went away while it registered (a crash, or its connection dropped on a loaded
  // machine): with somewhere to look (--coordinator A,B, or the same address back within the
  // grace), it registers afresh with the coordinator it reaches instead of exiting. Without, it
  // stops, as before.
  for (const bool can_look : {true, false})
    for (const bool holds_request : {true, false}) {
      CAPTURE(can_look);
      CAPTURE(holds_request);
      fixture f({.nodes = 1});
      // A coordinator that dies holding the nonce request (its answer never comes; the worker hears
      // of the death), or is gone before the request reaches it (the request bounces).
      auto vanishing = f.sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
        return {[self](nonce_request&) { return self->make_response_promise<std::string>(); }};
      });
      if (!holds_request) caf::anon_send_exit(vanishing, caf::exit_reason::kill);
      auto& w = f.add_worker({.name = "late", .stages = false,
                              .first_coordinator = caf::actor_cast<coordinator_actor>(vanishing),
                              .finds_coordinator = can_look});
      f.sched.run();
      if (holds_request) {
        CHECK(w.node == -1);
        caf::anon_send_exit(vanishing, caf::exit_reason::kill);
        f.sched.run();
      }
      const std::string said = w.said();
      INFO(said);
      INFO(describe(f.events));
      if (can_look) {
        CHECK(w.node == 0);
        CHECK(f.alive(w.handle));
        CHECK(count(f.events, {.kind = event_kind::node_joined}) == 1);
        CHECK(f.status().state == "ready");
        CHECK(std::any_of(w.log.begin(), w.log.end(), [](const std::string& l) {
          return l.find("before it admitted this node") != std::string::npos;
        }));
      } else {
        CHECK(w.node == -1);
        CHECK(!f.alive(w.handle));
        CHECK(count(f.events, {.kind = event_kind::node_joined}) == 0);
      }
    }
}

TEST_CASE("monitor: a coordinator that never answers over its connection: the worker closes it and registers afresh") {
  // A connection over which the coordinator receives requests but can never answer them (CAF 0.17
  // can leave one: apps/coordinator_link.hpp) looks like a coordinator that holds the nonce request
  // forever. A worker that can look for a coordinator and drop its link gives up on the nonce after
  // 10 s, closes the connection, and registers over a new one after relink_wait (1 s here), or at
  // the usual pace when no connection was left to close; one that cannot drop its link waits as
  // before.
  enum class link { closes_one, finds_none, cannot_drop };
  for (const auto how : {link::closes_one, link::finds_none, link::cannot_drop}) {
    CAPTURE(static_cast<int>(how));
    fixture f({.nodes = 1});
    auto silent = silent_coordinator(f);
    int drops = 0;
    auto o = late_worker(silent);
    if (how != link::cannot_drop)
      o.drop_link = [&drops, how] {
        ++drops;
        return static_cast<std::size_t>(how == link::closes_one ? 1 : 0);
      };
    auto& w = f.add_worker(o);
    f.sched.run();
    f.sched.advance_time(std::chrono::seconds(9));
    f.sched.run();
    CHECK(w.node == -1);  // still waiting for its nonce
    CHECK(drops == 0);
    f.sched.advance_time(std::chrono::seconds(1));  // 10 s: the nonce request times out
    f.sched.run();
    f.sched.advance_time(std::chrono::milliseconds(300));  // more than the usual pace, less than relink_wait
    f.sched.run();
    const std::string said = w.said();
    INFO(said);
    switch (how) {
      case link::closes_one:
        CHECK(drops == 1);
        CHECK(w.node == -1);  // not before relink_wait
        CHECK(said.find("no answer from the coordinator over this node's connection to it: closed it (1 connection(s)), "
                        "connecting afresh") != std::string::npos);
        f.sched.advance_time(std::chrono::milliseconds(700));
        f.sched.run();
        CHECK(w.node == 0);
        break;
      case link::finds_none:
        CHECK(drops == 1);
        CHECK(w.node == 0);
        CHECK(said.find("the connection it went over had already ended; looking again") != std::string::npos);
        break;
      case link::cannot_drop:
        CHECK(w.node == -1);  // waiting for the nonce as long as it takes
        CHECK(count(f.events, {.kind = event_kind::node_joined}) == 0);
        break;
    }
    CHECK(f.alive(w.handle));
    if (how != link::cannot_drop) CHECK(count(f.events, {.kind = event_kind::node_joined}) == 1);
    caf::anon_send_exit(silent, caf::exit_reason::kill);
    f.sched.run();
  }
}

TEST_CASE("monitor: a registration attempt that ends after a newer one was answered changes nothing") {
  // The first nonce request goes over a connection whose route CAF lost: never answered. The
  // node hears the coordinator's connection go down, finds a coordinator and is admitted; 10 s
  // after its first request, that request times out. Acting on it closed the connection to the
  // coordinator the node trains under and sent it looking again (the coordinator-loss e2e test
  // with a standby lost a node so, and with it the job).
  fixture f({.nodes = 1});
  auto silent = silent_coordinator(f);
  int drops = 0;
  auto o = late_worker(silent);
  o.drop_link = [&drops] { return static_cast<std::size_t>(++drops); };
  auto& w = f.add_worker(o);
  f.sched.run();
  REQUIRE(w.node == -1);  // its nonce request is pending
  caf::anon_send(caf::actor_cast<caf::actor>(w.handle), caf::down_msg{silent.address(), caf::exit_reason::remote_link_unreachable});
  f.sched.run();
  f.sched.advance_time(std::chrono::milliseconds(100));
  f.sched.run();
  REQUIRE(w.node == 0);  // admitted over the connection it found
  f.sched.advance_time(std::chrono::seconds(11));  // the first nonce request times out
  f.sched.run();
  f.sched.advance_time(std::chrono::seconds(2));
  f.sched.run();
  const std::string said = w.said();
  INFO(said);
  CHECK(drops == 0);
  CHECK(said.find("no answer from the coordinator") == std::string::npos);
  CHECK(said.find("coming back with this node's state") == std::string::npos);
  CHECK(w.node == 0);
  CHECK(count(f.events, {.kind = event_kind::node_joined}) == 1);
  CHECK(f.alive(w.handle));
  caf::anon_send_exit(silent, caf::exit_reason::kill);
  f.sched.run();
}

TEST_CASE("coordinator: a nonce request of another protocol version is refused") {
  fixture f({.nodes = 1});
  std::string nonce;
  CHECK(f.ask(nonce, nonce_request{protocol_version + 1}).rfind("wrong_version", 0) == 0);
}

TEST_CASE("coordinator: operator requests without a valid proof are refused") {
  fixture f({.nodes = 1});
  auto& w = start_worker(f, "node-a");
  job_status status;
  CHECK(f.ask(status, status_atom_v, control_proof{"forged", "00"}) == "bad_proof: unknown, expired or reused nonce");
  auto proof = f.operator_proof();
  proof.proof = control_proof_of(std::string(64, 'x'), proof.nonce);
  std::string reply;
  CHECK(f.ask(reply, inject_fault{0, fault_kind::kill, -1, 0}, proof).rfind("bad_proof", 0) == 0);
  CHECK(w.faults.empty());
  // A proof is good once.
  proof = f.operator_proof();
  CHECK(f.ask(status, status_atom_v, proof) == "ok");
  CHECK(f.ask(status, status_atom_v, proof).rfind("bad_proof", 0) == 0);
}

TEST_CASE("coordinator: an injected fault reaches the node's monitor, and unknown nodes are refused") {
  fixture f({.nodes = 1});
  auto& w = start_worker(f, "node-a");
  std::string reply;
  CHECK(f.ask(reply, inject_fault{0, fault_kind::hang, -1, 2.5}, f.operator_proof()) == "ok");
  CHECK(reply == "sent hang to node 0 (node-a)");
  REQUIRE(w.faults.size() == 1);
  CHECK(w.faults[0].seconds == 2.5);
  CHECK(f.ask(reply, inject_fault{7, fault_kind::kill, -1, 0}, f.operator_proof()) ==
        "unknown_node: node 7 is not a live node of this job");
}

TEST_CASE("coordinator: a fault for a node that has not joined yet is delivered on its admission") {
  fixture f({.nodes = 2});
  std::string reply;
  CHECK(f.ask(reply, inject_fault{1, fault_kind::kill, 3, 0}, f.operator_proof()) == "ok");
  CHECK(reply == "kill at step 3 for node 1: delivered when it joins");
  // Only a fault for a later step waits; one meant to act now needs a live node.
  CHECK(f.ask(reply, inject_fault{5, fault_kind::kill, -1, 0}, f.operator_proof()).rfind("unknown_node", 0) == 0);
  auto& a = start_worker(f, "node-a");
  CHECK(a.faults.empty());
  auto& b = start_worker(f, "node-b");
  REQUIRE(b.node == 1);
  REQUIRE(b.faults.size() == 1);
  CHECK(b.faults[0].at_step == 3);
  // The admission first, then the fault: the node knows who it is before anything is asked of it.
  // (Without stages the monitor carries a fault for a later step out at once: here, recorded.)
  CHECK(b.trace == std::vector<std::string>{"admitted 1", "fault kill at 3"});
}

TEST_CASE("coordinator: a node whose monitor goes down is lost, once, and subscribers hear it") {
  fixture f({.nodes = 2});
  start_worker(f, "node-a");
  auto& b = start_worker(f, "node-b");
  caf::scoped_actor listener{f.sys};
  std::string reply;
  REQUIRE(f.ask(reply, subscribe_atom_v, caf::actor{listener}, f.operator_proof()) == "ok");
  const auto published_before = f.events.size();
  caf::anon_send_exit(b.handle, caf::exit_reason::kill);
  f.sched.run();
  std::vector<job_event> events;
  bool more = true;
  while (more)
    listener->receive([&](job_event& e) { events.push_back(e); },
                      caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == event_kind::node_lost);
  CHECK(events[0].node == 1);
  // The subscriber heard exactly what was published (to on_event as well), in the same order.
  CHECK(std::vector<job_event>(f.events.begin() + static_cast<std::ptrdiff_t>(published_before), f.events.end()) ==
        events);
  const job_status s = f.status();
  CHECK(s.state == "registering");
  CHECK(s.nodes[1].state == "lost");
}

TEST_CASE("coordinator: shutdown stops every monitor") {
  fixture f({.nodes = 1});
  auto& a = start_worker(f, "node-a");
  auto& b = start_worker(f, "node-b");
  std::string reply;
  CHECK(f.ask(reply, shutdown_atom_v, std::string("done"), false, f.operator_proof()) == "ok");
  CHECK(reply == "shutting down");
  CHECK_FALSE(f.alive(a.handle));
  CHECK_FALSE(f.alive(b.handle));
  INFO(describe(f.events));
  const auto& stop = f.stop();
  CHECK(stop.outcome == stop_outcome::shutdown);
  CHECK(stop.detail == "done");
  // What the worker tells its user on purpose: why it stopped.
  REQUIRE_FALSE(a.log.empty());
  CHECK(a.log.back().find("shut down by the coordinator: done") != std::string::npos);
}

TEST_CASE("monitor: a monitor whose coordinator is gone says so and stops") {
  fixture f({.nodes = 1});
  auto& a = start_worker(f, "node-a");
  f.self->monitor(a.handle);
  f.self->send_exit(f.coord, caf::exit_reason::kill);
  f.sched.run();
  // It ends as lost contact (oobleck-worker's exit status 3), not as a shutdown.
  std::optional<caf::error> reason;
  f.self->receive([&](caf::down_msg& dm) { reason = dm.reason; }, caf::after(std::chrono::seconds(0)) >> [] {});
  REQUIRE(reason);
  CHECK(*reason == caf::make_error(caf::exit_reason::remote_link_unreachable));
  // What the worker tells its user on purpose.
  REQUIRE_FALSE(a.log.empty());
  CHECK(a.log.back().find("lost contact with the coordinator") != std::string::npos);
}
