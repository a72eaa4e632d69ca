// Every message of the actors' protocol survives the trip through CAF's binary serializer as a
// type-erased message (what the middleman does between processes): a type that was not registered
// in the type-ID block, or whose inspect() forgets a field, fails here instead of at run time.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message.hpp>

#include "messages/actor_interfaces.hpp"
#include "messages/protocol.hpp"

using namespace oobleck::messages;
using oobleck::planning::layer_index;
using oobleck::planning::no_rank;
using oobleck::planning::node_id;
using oobleck::planning::rank;

namespace {

struct protocol_fixture {
  struct config : caf::actor_system_config {
    config() {
      add_protocol_types(*this);
      set("scheduler.max-threads", 1);
    }
  };
  config cfg;
  caf::actor_system sys{cfg};

  /// Serializes `x` inside a message and reads it back as a message.
  template <class T>
  T round_trip(const T& x) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto msg = caf::make_message(x);
    if (auto err = sink(msg)) FAIL("serialize " << caf::type_name<T>::value << ": " << sys.render(err));
    caf::binary_deserializer source{sys, buf};
    caf::message out;
    if (auto err = source(out)) FAIL("deserialize " << caf::type_name<T>::value << ": " << sys.render(err));
    REQUIRE(out.size() == 1);
    REQUIRE(out.match_element<T>(0));
    return out.get_as<T>(0);
  }

  template <class T>
  void check(const T& x) {
    CAPTURE(caf::type_name<T>::value);
    CHECK(round_trip(x) == x);
    CHECK(!(T{} == x));  // the sample sets fields away from their defaults
    CHECK(!caf::deep_to_string(x).empty());
  }
};

endpoint sample_endpoint() { return {"10.0.0.7", 29'500}; }

}  // namespace

TEST_CASE_FIXTURE(protocol_fixture, "protocol: admission messages round-trip") {
  check(sample_endpoint());
  check(nonce_request{protocol_version});
  check(register_node{protocol_version, "0f1e2d", "node-a", 2, "cuda", sample_endpoint(), "n0nce", "c0ffee",
                      17});
  check(admission{node_id{5}, "[model]\nlayers = 4\n", "0f1e2d"});
  check(control_proof{"n0nce", "c0ffee"});
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: epoch messages round-trip") {
  const stage_assignment s{1, 2, 3, layer_index{4}, layer_index{8}, rank{0}, rank{5}, 2};
  check(s);
  check(epoch_copy{layer_index{3}, rank{1}, rank{4}});
  epoch_assignment a;
  a.epoch = 7;
  a.next_step = 42;
  a.rank = rank{2};
  a.peers = {sample_endpoint(), {"10.0.0.8", 1}};
  a.stages = {s, {0, 0, 1, layer_index{0}, layer_index{4}, no_rank, no_rank}};
  a.layer_groups = {{rank{0}, rank{1}}, {rank{2}}, {}};
  a.copies = {{layer_index{3}, rank{1}, rank{4}}, {layer_index{0}, rank{0}, rank{2}}};
  a.pipeline_microbatches = {3, 5};
  check(a);
  a.resume_dir = "/shared/ckpt/step-00000012";
  check(a);
  check(abort_epoch{7, "node 3 lost"});
  check(epoch_aborted{7, node_id{3}});
  check(node_fault{7, node_id{3}, "all_reduce_sum over {0,1}: peer 1 closed the connection"});
  check(form_timing{1200, 35000, 800, 9437184, 4718592, 950, 21000});
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: checkpoint messages round-trip") {
  check(write_checkpoint{3, 12, "/shared/ckpt/.tmp-step-00000012-1-2", {layer_index{0}, layer_index{4}, layer_index{5}}});
  check(checkpoint_layer_file{layer_index{4}, 123456, std::string(64, 'a')});
  check(checkpoint_written{
      3, node_id{2}, {{layer_index{4}, 10, "ab"}, {layer_index{5}, 11, "cd"}}, {layer_index{0}}, ""});
  check(checkpoint_written{3, node_id{2}, {}, {}, "cannot create /x: Permission denied"});
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: actor handles inside messages round-trip") {
  auto a = sys.spawn([]() -> caf::behavior { return {[](int) {}}; });
  auto b = sys.spawn([]() -> caf::behavior { return {[](int) {}}; });
  const node_ready r{3, node_id{9}, {a, b}, form_timing{1, 2, 3, 4, 5, 6, 7}};
  const node_ready back = round_trip(r);
  CHECK(back == r);
  CHECK(back.stages.at(0) == a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: step messages round-trip") {
  check(run_step{2, 11});
  check(stage_step{2, 11, 4, 3});
  check(stage_step{2, 11, 4, 3, false, true, commit_step{2, 10, 0.5, false, true}});
  check(run_step{2, 11, false, 0, 0, true, commit_step{2, 10, 0.25, true, true}});
  check(stage_done{2, 11, 1, 3, 12.5, ""});
  check(stage_done{2, 11, 1, 3, 0, "stage failed: out of memory"});
  check(pipeline_done{2, 11, 1, 12.5, ""});
  check(stage_timing{40.25, 30.5, 6.125, 2.0});
  check(stage_done{2, 11, 1, 3, 12.5, "", {40.25, 30.5, 6.125, 2.0}});
  check(pipeline_done{2, 11, 1, 12.5, "", {40.25, 30.5, 6.125, 2.0}});
  check(step_committed{2, 11, node_id{6}, {{layer_index{0}, 1}}, 3.5, 2.25});
  check(commit_step{2, 11});
  check(layer_digest{layer_index{4}, 0xdeadbeefcafef00dULL});
  check(step_committed{2, 11, node_id{6}, {{layer_index{0}, 1}, {layer_index{1}, 0xffffffffffffffffULL}}});
  // Ids travel as their integers: a node id beyond 32 bits survives.
  CHECK(round_trip(node_fault{1, node_id{std::int64_t{1} << 40}, ""}).node == node_id{std::int64_t{1} << 40});
  // Stage faults: a node's own failure, the stall probe and its report, the coordinator's deadlines.
  check(node_fault{4, node_id{2}, "injected: out of memory", true});
  CHECK(round_trip(node_fault{4, node_id{2}, "x", true}).own);
  CHECK(round_trip(node_fault{4, node_id{2}, "x", true, true}).in_commit);
  check(stall_probe{4, 9});
  check(stall_report{9, node_id{2}, 4, false, true, 1234.5, 0.25});
  check(coordinator_deadline{deadline_kind::form, 4, 7, 9});
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: control messages round-trip, enums by value") {
  check(inject_fault{3, fault_kind::hang, 12, 2.5});
  CHECK(round_trip(inject_fault{3, fault_kind::kill, -1, 0}).kind == fault_kind::kill);
  check(inject_fault{3, fault_kind::error, -1, 0, 1});
  check(inject_fault{3, fault_kind::stall, 12, 0, 0});
  CHECK(round_trip(inject_fault{3, fault_kind::stall, 12, 0, 2}).attempts == 2);
  check(node_status{3, "node-c", "training", 1});
  check(pipeline_status{{0, 3, 5}, {0, 4, 9, 12}, 6});
  job_status js;
  js.state = "training";
  js.epoch = 2;
  js.committed_steps = 30;
  js.last_loss = 3.25;
  js.samples_per_second = 118.5;
  js.dropped_messages = 4;
  js.nodes = {{0, "a", "training", 0}, {1, "b", "lost", -1}};
  js.pipelines = {{{0}, {0, 12}, 8}};
  check(js);
  check(job_event{event_kind::node_lost, 2, 30, 1, 0, "down_msg"});
  CHECK(round_trip(job_event{event_kind::stopped, 0, 0, -1, 0, ""}).kind == event_kind::stopped);
  check(job_event{event_kind::epoch_forming, 4, 12, -1, 0, "simple+join", {3, 5}, {8}, stop_outcome::none, 0});
  check(job_event{event_kind::stopped, 4, 20, -1, 1.5, "training finished", {}, {}, stop_outcome::finished, 20});
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: errors carry their category, code and sentence") {
  const caf::error e = make_error(protocol_error::wrong_job, "the worker runs job 1a2b, not 3c4d");
  CHECK(is_protocol_error(e));
  CHECK(!is_protocol_error(caf::make_error(caf::sec::request_timeout)));
  CHECK(describe(e) == "wrong_job: the worker runs job 1a2b, not 3c4d");
  CHECK(describe(make_error(protocol_error::bad_proof)) == "bad_proof");
  // Errors cross process boundaries too (as a request's failure).
  caf::error back = round_trip(e);
  CHECK(back == e);
  CHECK(describe(back) == describe(e));
  CHECK(sys.render(e).find("wrong_job") != std::string::npos);
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: every type of the block has a distinct registered name") {
  const auto begin = caf::id_block::oobleck::begin;
  const auto end = caf::id_block::oobleck::end;
  CHECK(end - begin == 36);
  CHECK(std::string(caf::type_name<register_node>::value) == "oobleck::messages::register_node");
  CHECK(std::string(caf::type_name<stall_report>::value) == "oobleck::messages::stall_report");
  CHECK(caf::type_id<coordinator_deadline>::value == end - 1);
}

TEST_CASE_FIXTURE(protocol_fixture, "protocol: infinities and NaNs cross the wire (CAF's own float encoding never returns)") {
  // Found by fuzz/caf_message: CAF 0.17's pack754 loops forever on an infinity or a NaN, so a
  // diverging loss or a crafted `seconds` hung the sender. Doubles travel as their bits now.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto done = round_trip(stage_done{1, 2, 0, 3, nan, ""});
  CHECK(std::isnan(static_cast<double>(done.loss_sum)));
  CHECK(round_trip(pipeline_done{1, 2, 0, -inf, ""}).loss_sum == -inf);
  CHECK(round_trip(inject_fault{1, fault_kind::hang, 3, inf}).seconds == inf);
  job_status s;
  s.last_loss = nan;
  s.samples_per_second = inf;
  CHECK(round_trip(s) == s);  // bitwise
  CHECK(round_trip(job_event{event_kind::step_committed, 1, 2, -1, 1e308, ""}).loss == 1e308);
  CHECK(round_trip(stage_done{1, 2, 0, 3, 0.1, ""}).loss_sum == 0.1);  // exact, not re-encoded
}
