// Who may speak to the coordinator (issue 23, item 2; ARCHITECTURE.md §5 "Who may speak"), on the
// deterministic protocol fixture: a node-side message counts only when it comes from the actor the
// coordinator admitted for the node it names (its monitor) or spawned for the pipeline it names;
// anything else is refused, counted and logged (once per power of ten per sender), and the job
// goes on as if it had never been sent. Messages from the real monitor with indices or sizes the
// epoch does not allow are refused the same way, never thrown on. The pipeline takes a stage's
// answer only from that stage (CAF 0.17 matches responses by id alone). Nonce floods cannot take a
// worker's nonce away, and lost nodes' entries are bounded.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/admission.hpp"
#include "actors/pipeline.hpp"
#include "actors/protocol_fixture.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;
using namespace oobleck::testing;
using oobleck::planning::layer_index;
using oobleck::planning::node_id;

namespace {

/// The coordinator's state, read between runs of the deterministic scheduler (nothing runs then).
const coordinator_state& state_of(fixture& f) {
  auto* ptr = caf::actor_cast<caf::abstract_actor*>(f.coord);
  auto* self = dynamic_cast<coordinator_pointer>(ptr);
  REQUIRE(self != nullptr);
  return self->state;
}

std::size_t lines_with(const fixture& f, const std::string& text) {
  return static_cast<std::size_t>(
      std::count_if(f.log.begin(), f.log.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; }));
}

/// Sends, through `send`, every node-side message naming `node` for the epoch and step in force,
/// as a stranger would forge them: a fault, a ready, a committed step with plausible digests, a
/// written checkpoint, an aborted epoch, and a successful pipeline_done for every pipeline.
/// Returns how many.
template <class Send>
std::size_t forge(Send send, std::uint64_t epoch, std::uint64_t step, std::int64_t node, int pipelines) {
  const node_id n{node};
  send(node_fault{epoch, n, "forged fault"});
  send(node_ready{epoch, n, {}});
  std::vector<layer_digest> digests;
  for (int l = 0; l < 6; ++l) digests.push_back({layer_index{l}, 1000u + step});
  send(step_committed{epoch, step, n, digests});
  send(checkpoint_written{1, n, {{layer_index{0}, 1, std::string(64, 'a')}}, {}, {}});
  send(epoch_aborted{epoch, n});
  for (int p = 0; p < pipelines; ++p) send(pipeline_done{epoch, step, p, 16.0, ""});
  return 5 + static_cast<std::size_t>(pipelines);
}

caf::actor spawn_stranger(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[](int) {}};
  });
}

}  // namespace

TEST_CASE("who may speak: node-side messages from an actor that is not the node's monitor are refused, and the job goes on") {
  // Three pipelines of one node each; node 0 holds step 1, so the job sits in step 1's training.
  fixture f(fixture::roomy(3, 4));
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  REQUIRE(f.records.size() == 1);
  const auto before = f.status();
  REQUIRE(before.state == "training");
  const int pipelines = static_cast<int>(before.pipelines.size());
  REQUIRE(pipelines >= 2);

  // A stranger (an actor of the test, never admitted) forges every node-side message for every
  // node, for the epoch and step in force, twice; and once more anonymously.
  auto stranger = spawn_stranger(f.sys);
  std::size_t sent = 0;
  for (int round = 0; round < 2; ++round)
    for (std::int64_t node : {0, 1, 2})
      sent += forge([&](auto m) { caf::send_as(stranger, f.coord, std::move(m)); }, before.epoch, 1, node, pipelines);
  sent += forge([&](auto m) { caf::anon_send(f.coord, std::move(m)); }, before.epoch, 1, 1, pipelines);
  // A node's monitor speaking for another node is a stranger too.
  caf::send_as(f.monitors.at(1), f.coord, node_fault{before.epoch, node_id{0}, "not mine to say"});
  ++sent;
  f.sched.run();

  const auto after = f.status();
  CHECK(after.refused_messages == before.refused_messages + sent);
  CHECK(after.dropped_messages == before.dropped_messages + sent);
  // Nothing changed: no failure, no new epoch, no commit of the step node 0 still holds.
  CHECK(after.state == "training");
  CHECK(after.epoch == before.epoch);
  CHECK(after.committed_steps == 1);
  CHECK(f.records.size() == 1);
  CHECK(!f.happened({.kind = event_kind::step_failed}));
  CHECK(f.stages.at(1)->commits_of(1) == 0);
  // Each sender is named at its 1st, 10th, 100th... refusal, not once per message: the stranger's
  // 2 x 3 x (5 + pipelines) messages make 2 lines, the anonymous ones 1.
  const std::string name = caf::to_string(caf::actor_cast<caf::strong_actor_ptr>(stranger));
  CHECK(lines_with(f, name) == 2);
  CHECK(lines_with(f, "an anonymous sender") == 1);

  // The job goes on: node 0 dies, the job recovers without it and finishes every step.
  f.kill(0);
  f.sched.run();
  CHECK(f.happened({.kind = event_kind::stopped, .outcome = stop_outcome::finished}));
  CHECK(f.records.size() == 4);
  for (std::size_t k = 0; k < f.records.size(); ++k) CHECK(f.records[k].step == k);
  caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
}

TEST_CASE("who may speak: a forged pipeline_done, even from another pipeline's actor, cannot commit a step") {
  fixture f(fixture::roomy(3, 3));
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  const auto before = f.status();
  REQUIRE(before.state == "training");
  const auto& st = state_of(f);
  REQUIRE(st.current.pipelines.size() >= 2u);
  // The held pipeline is node 0's; every other one reported step 1 already. Another pipeline's
  // actor now claims the held one's report, and reports for pipelines the epoch does not have.
  int held = -1;
  for (std::size_t i = 0; i < st.current.pipelines.size(); ++i)
    if (st.current.pipelines[i].nodes.front() == node_id{0}) held = static_cast<int>(i);
  REQUIRE(held >= 0);
  const auto other = st.current.pipelines[held == 0 ? 1 : 0].actor;
  REQUIRE(other);
  caf::send_as(other, f.coord, pipeline_done{before.epoch, 1, held, 8.0, ""});
  caf::send_as(other, f.coord, pipeline_done{before.epoch, 1, 7, 8.0, ""});
  caf::send_as(other, f.coord, pipeline_done{before.epoch, 1, -1, 8.0, ""});
  f.sched.run();
  const auto after = f.status();
  CHECK(after.refused_messages == before.refused_messages + 3);
  CHECK(after.state == "training");
  CHECK(after.committed_steps == 1);
  for (std::int64_t n : {0, 1, 2}) CHECK(f.stages.at(n)->commits_of(1) == 0);
}

TEST_CASE("who may speak: malformed messages from a node's own monitor are refused, never thrown on") {
  SUBCASE("a node_ready with fewer stages than the epoch gave the node") {
    // Node 1 never answers epoch 1's assignment, so the job waits in forming; its monitor then
    // reports ready with no stage handle although the epoch gave it one stage. Before, the
    // coordinator took it and threw out of its handler (start_training's .at()).
    fixture f(fixture::roomy(3, 2));
    f.start({{1, [](fake_stage_record& r) { r.hold_form = {1}; }}});
    const auto before = f.status();
    REQUIRE(before.state == "forming");
    caf::send_as(f.monitors.at(1), f.coord, node_ready{before.epoch, node_id{1}, {}});
    // Stage handles of another process... here: a handle that is no stage at all.
    caf::send_as(f.monitors.at(1), f.coord, node_ready{before.epoch, node_id{1}, {caf::actor{}}});
    f.sched.run();
    const auto after = f.status();
    CHECK(after.refused_messages == before.refused_messages + 2);
    CHECK(after.state == "forming");
    CHECK(after.epoch == before.epoch);
    // The job goes on: node 1's loss re-forms the job without it, and it finishes.
    f.kill(1);
    f.sched.run();
    CHECK(f.happened({.kind = event_kind::stopped, .outcome = stop_outcome::finished}));
    CHECK(f.records.size() == 2);
  }
  SUBCASE("digests and checkpoint files of layers the model does not have") {
    fixture f(fixture::roomy(3, 3));
    f.start({{0, [](fake_stage_record& r) { r.hold_commit = std::pair{1u, 1u}; }}});
    const auto before = f.status();
    REQUIRE(before.state == "committing");
    // Node 0's monitor (its stage holds the commit) sends a commit with digests of layers 6 and
    // -1 (the model has 0..5), then one that names a layer twice, then one with too many digests.
    caf::send_as(f.monitors.at(0), f.coord, step_committed{before.epoch, 1, node_id{0}, {{layer_index{6}, 1001}}});
    caf::send_as(f.monitors.at(0), f.coord, step_committed{before.epoch, 1, node_id{0}, {{layer_index{-1}, 1001}}});
    caf::send_as(f.monitors.at(0), f.coord,
                 step_committed{before.epoch, 1, node_id{0}, {{layer_index{2}, 1001}, {layer_index{2}, 1001}}});
    std::vector<layer_digest> many(7, {layer_index{0}, 1001});
    caf::send_as(f.monitors.at(0), f.coord, step_committed{before.epoch, 1, node_id{0}, many});
    caf::send_as(f.monitors.at(0), f.coord,
                 checkpoint_written{1, node_id{0}, {{layer_index{40}, 1, std::string(64, 'a')}}, {}, {}});
    caf::send_as(f.monitors.at(0), f.coord, checkpoint_written{1, node_id{0}, {}, {layer_index{-3}}, {}});
    f.sched.run();
    const auto after = f.status();
    CHECK(after.refused_messages == before.refused_messages + 6);
    CHECK(after.state == "committing");
    CHECK(after.committed_steps == 1);
    // The job goes on: node 0 dies during the commit (which stands), the job finishes without it.
    f.kill(0);
    f.sched.run();
    CHECK(f.happened({.kind = event_kind::stopped, .outcome = stop_outcome::finished}));
    CHECK(f.records.size() == 3);
    for (const auto& r : f.records)
      for (const auto& [layer, digests] : r.layer_digests) CHECK((layer.value >= 0 && layer.value < 6));
  }
}

TEST_CASE("who may speak: a stranger's exit (even kill), error, down or unknown message does not end the coordinator") {
  fixture f(fixture::roomy(3, 3));
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 1u}; }}});
  const auto before = f.status();
  REQUIRE(before.state == "training");
  auto stranger = spawn_stranger(f.sys);
  const auto coordinator = caf::actor_cast<caf::actor>(f.coord);
  // Anonymous exits (CAF 0.17 quits on any exit_reason::kill, and a peer's anonymous message has
  // no sender here), and an error message (CAF quits on one by default). An exit from an actor of
  // another process is refused too: the stranger e2e test sends one (here every actor is local).
  caf::anon_send_exit(coordinator, caf::exit_reason::kill);
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  caf::send_as(stranger, coordinator, caf::make_error(caf::sec::runtime_error));
  // A down message claiming node 1's monitor is gone, sent by the stranger.
  caf::send_as(stranger, coordinator, caf::down_msg{f.monitors.at(1).address(), caf::exit_reason::kill});
  caf::send_as(stranger, coordinator, 42);
  f.sched.run();
  REQUIRE(f.alive(caf::actor_cast<monitor_actor>(f.coord)));
  const auto after = f.status();
  CHECK(after.refused_messages == before.refused_messages + 5);
  CHECK(after.state == "training");
  CHECK(after.epoch == before.epoch);
  CHECK(!f.happened({.kind = event_kind::node_lost}));
  // Its own process still stops it (the fixture does, at the end) and real losses still count.
  f.kill(0);
  f.sched.run();
  CHECK(f.happened({.kind = event_kind::node_lost, .node = 0}));
  CHECK(f.happened({.kind = event_kind::stopped, .outcome = stop_outcome::finished}));
  caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
}

TEST_CASE("who may speak: a flood of refused messages is logged a few times, each line naming its sender") {
  fixture f(fixture::roomy(2, 2));
  f.start({{0, [](fake_stage_record& r) { r.hold_step = std::pair{1u, 0u}; }}});
  auto stranger = spawn_stranger(f.sys);
  const auto before = f.status();
  for (int i = 0; i < 2000; ++i) caf::send_as(stranger, f.coord, node_fault{before.epoch, node_id{0}, "flood"});
  f.sched.run();
  CHECK(f.status().refused_messages == before.refused_messages + 2000);
  const std::string name = caf::to_string(caf::actor_cast<caf::strong_actor_ptr>(stranger));
  // Its 1st, 10th, 100th and 1000th refusal: 4 lines for 2000 messages.
  CHECK(lines_with(f, name) == 4);
  CHECK(f.status().state == "training");
  caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
}

TEST_CASE("who may speak: a stranger's nonce requests cannot take a worker's pending nonce away") {
  fixture f(fixture::roomy(1, 0));
  // A worker (played by the test) asks for its nonce...
  caf::scoped_actor worker{f.sys};
  auto asked = worker->request(f.coord, caf::infinite, nonce_request{protocol_version});
  f.sched.run();
  std::string nonce;
  asked.receive([&](std::string& n) { nonce = n; }, [](caf::error& e) { FAIL("no nonce: " << describe(e)); });
  REQUIRE(!nonce.empty());
  // ... a stranger floods the coordinator with nonce requests before the worker registers ...
  auto stranger = spawn_stranger(f.sys);
  for (int i = 0; i < 3000; ++i) caf::send_as(stranger, f.coord, nonce_request{protocol_version});
  f.sched.run();
  // ... and many strangers ask once each, filling the book.
  std::vector<caf::actor> crowd;
  for (int i = 0; i < 1100; ++i) {
    crowd.push_back(spawn_stranger(f.sys));
    caf::send_as(crowd.back(), f.coord, nonce_request{protocol_version});
  }
  f.sched.run();
  CHECK(state_of(f).nonces.outstanding() <= 1024u);
  // The worker's registration with its nonce is admitted.
  register_node r{protocol_version, "", "w0", 1, "cpu", {"127.0.0.1", 5000}, nonce, admission_proof(fixture::token, nonce, "w0"), -1};
  admission a;
  CHECK(f.ask(a, r) == "ok");
  CHECK(f.happened({.kind = event_kind::node_joined, .detail = "w0"}));
  caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
  for (auto& c : crowd) caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
}

TEST_CASE("registry: lost nodes' entries are bounded, the newest kept for status") {
  fixture f(fixture::roomy(1, 0));  // admission only: the job waits for one node and serves status
  std::vector<fixture::worker*> ws;
  const int total = static_cast<int>(coordinator_state::lost_entries_kept) + 20;
  for (int i = 0; i < total; ++i) ws.push_back(&f.add_worker({.name = "w" + std::to_string(i), .stages = false}));
  f.sched.run();
  for (int i = 0; i + 1 < total; ++i) caf::anon_send_exit(ws[static_cast<std::size_t>(i)]->handle, caf::exit_reason::kill);
  f.sched.run();
  const auto s = f.status();
  std::size_t lost = 0, alive = 0;
  for (const auto& n : s.nodes) (n.state == "lost" ? lost : alive) += 1;
  CHECK(alive == 1u);
  CHECK(lost == coordinator_state::lost_entries_kept);
  // The newest losses are the ones kept.
  const auto newest = std::find_if(s.nodes.begin(), s.nodes.end(),
                                   [&](const node_status& n) { return n.node == total - 2; });
  CHECK(newest != s.nodes.end());
  const auto oldest = std::find_if(s.nodes.begin(), s.nodes.end(), [](const node_status& n) { return n.node == 0; });
  CHECK(oldest == s.nodes.end());
}

// The pipeline actor, alone: a held stage, a forged answer with the id of the pipeline's request.
namespace {

struct held_stage {
  caf::message_id request;
  caf::response_promise promise;
  bool asked = false;
};

caf::behavior holding_stage(caf::event_based_actor* self, held_stage* h) {
  return {
      [self, h](stage_step&) {
        h->request = self->current_message_id();
        h->promise = self->make_response_promise();
        h->asked = true;
      },
      [h](std::string&) { h->promise.deliver(stage_done{1, 0, 0, 0, 4.0, {}}); },
  };
}

}  // namespace

TEST_CASE("pipeline: a stage's answer is taken from that stage only, and a forged one does not take its place") {
  fixture::config cfg;
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  held_stage h;
  auto stage = sys.spawn(holding_stage, &h);
  std::vector<pipeline_done> reports;
  auto coordinator = sys.spawn([&reports](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[&reports](pipeline_done& d) { reports.push_back(d); }};
  });
  pipeline_deps d;
  d.epoch = 1;
  d.index = 0;
  d.stages = {caf::actor_cast<stage_actor>(stage)};
  d.first_microbatch = 0;
  d.microbatches = 2;
  d.coordinator = caf::actor_cast<coordinator_actor>(coordinator);
  auto p = sys.spawn(pipeline, d);
  sched.run();
  // run_step from anyone but its coordinator is refused (the stage is not asked).
  caf::anon_send(p, run_step{1, 0});
  sched.run();
  CHECK(!h.asked);
  caf::send_as(coordinator, p, run_step{1, 0});
  sched.run();
  REQUIRE(h.asked);
  // A stranger answers in the stage's place, with the request's id: a success and an error.
  auto stranger = spawn_stranger(sys);
  auto target = caf::actor_cast<caf::strong_actor_ptr>(p);
  target->enqueue(caf::actor_cast<caf::strong_actor_ptr>(stranger), h.request.response_id(),
                  caf::make_message(stage_done{1, 0, 0, 0, 99.0, {}}), nullptr);
  target->enqueue(caf::actor_cast<caf::strong_actor_ptr>(stranger), h.request.response_id(),
                  caf::make_message(make_error(protocol_error::bad_request, "forged")), nullptr);
  sched.run();
  CHECK(reports.empty());
  // The stage's own answer still finds the wait: the pipeline reports it, with its loss.
  caf::anon_send(stage, std::string("answer"));
  sched.run();
  REQUIRE(reports.size() == 1u);
  CHECK(reports[0].error.empty());
  CHECK(static_cast<double>(reports[0].loss_sum) == 4.0);
  for (const auto& a : {caf::actor_cast<caf::actor>(p), stage, coordinator, stranger})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE("who may speak: requests without a sender are dropped, counted and said, and take no nonce") {
  // What reaches the coordinator over a connection whose route CAF 0.17 lost (apps/
  // coordinator_link.hpp): no answer can go back, so none is computed and no nonce is issued.
  fixture f(fixture::roomy(1, 0));
  const auto before = f.status();
  const auto nonces = state_of(f).nonces.outstanding();
  for (int i = 0; i < 10; ++i) caf::anon_send(f.coord, nonce_request{protocol_version});
  caf::anon_send(f.coord, register_node{protocol_version, "", "w0", 1, "cpu", {"127.0.0.1", 5000}, "n", "p", -1});
  f.sched.run();
  CHECK(state_of(f).nonces.outstanding() == nonces);
  const auto after = f.status();
  CHECK(after.refused_messages == before.refused_messages + 11);
  CHECK(after.dropped_messages == before.dropped_messages + 11);
  CHECK(!f.happened({.kind = event_kind::node_refused}));  // the registration was never looked at
  // Said at the 1st and 10th (one sender name for all: anonymous).
  std::size_t said = 0;
  for (const auto& l : f.log)
    if (l.find("came without a sender, so no answer can reach it") != std::string::npos) ++said;
  CHECK(said == 2u);
}
