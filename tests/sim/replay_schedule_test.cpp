#include "sim/replay_schedule.hpp"

#include <doctest/doctest.h>

#include "messages/input_error.hpp"

using namespace oobleck::sim;

namespace {

replay_schedule schedule_of(const std::string& text, int slots, bool joins = true) {
  return make_replay_schedule(parse_trace(text, "t"), {.slots = slots, .joins = joins});
}

}  // namespace

TEST_CASE("replay schedule: nodes take free slots in the order they are added, spares join when one frees") {
  const auto s = schedule_of(
      "0,add,a\n0,add,b\n0,add,c\n"
      "10,remove,a\n"  // c takes a's slot at once (a new worker: a join)
      "20,add,d\n"     // every slot taken: d waits
      "30,remove,d\n"  // d leaves before it ever had a worker
      "40,remove,b\n"  // nobody waits: the cluster shrinks
      "50,add,e\n"     // a free slot: e joins
      "60,add,f\n",    // every slot taken again: f waits to the end
      2);
  CHECK(s.initial == std::vector<std::string>{"a", "b"});
  REQUIRE(s.events.size() == 3);
  CHECK(s.events[0].ms == 10);
  CHECK(s.events[0].removed == std::vector<std::string>{"a"});
  CHECK(s.events[0].killed == std::vector<int>{0});
  CHECK(s.events[0].added == std::vector<std::string>{"c"});
  CHECK(s.events[0].started == std::vector<int>{2});
  CHECK(s.events[1].ms == 40);
  CHECK(s.events[1].killed == std::vector<int>{1});
  CHECK(s.events[1].started.empty());
  CHECK(s.events[2].ms == 50);
  CHECK(s.events[2].started == std::vector<int>{3});  // workers are numbered in order of start
  CHECK(s.end_ms == 60);
  CHECK(s.adds_without_slot == 2);       // d, f
  CHECK(s.removes_without_worker == 1);  // d's removal
  CHECK(s.workers() == 4);
  CHECK(describe(s.events[0]) == "trace 0 s: remove a (kill worker 0); add c (start worker 2)");
}

TEST_CASE("replay schedule: without joins only the starting nodes that have a slot are replayed") {
  const auto s = schedule_of("0,add,a\n0,add,b\n0,add,c\n10,remove,c\n20,add,d\n30,remove,a\n", 2, false);
  CHECK(s.initial == std::vector<std::string>{"a", "b"});
  REQUIRE(s.events.size() == 1);
  CHECK(s.events[0].ms == 30);
  CHECK(s.events[0].killed == std::vector<int>{0});
  CHECK(s.adds_without_slot == 2);       // c, d
  CHECK(s.removes_without_worker == 1);  // c
}

TEST_CASE("replay schedule: a node added and removed at the same time never gets a worker") {
  const auto s = schedule_of("5,add,a\n5,add,b\n9,remove,b\n9,add,b2\n9,remove,b2\n", 3);
  CHECK(s.initial == std::vector<std::string>{"a", "b"});
  REQUIRE(s.events.size() == 1);
  CHECK(s.events[0].ms == 4);  // relative to the trace's first time
  CHECK(s.events[0].killed == std::vector<int>{1});
  CHECK(s.events[0].started.empty());
}

TEST_CASE("replay schedule: the simulator sees the same node subset (replay_trace)") {
  const auto s = schedule_of("0,add,a\n0,add,b\n0,add,c\n1000,remove,a\n3000,add,d\n4000,remove,b\n", 2);
  const auto events = replay_trace(s);
  // a and b from the start; c when a's slot frees; d waits (full) and takes b's slot at 4 s.
  const auto ct = to_cluster_trace(events, {.ready_delay_ms = 500, .time_scale = 0.5, .initial_nodes_ready = true});
  REQUIRE(ct.names == std::vector<std::string>{"a", "b", "c", "d"});
  REQUIRE(ct.changes.size() == 5);
  CHECK(ct.changes[0].ready == std::vector<int>{0, 1});
  CHECK(ct.changes[1].ms == 500);  // 1 s x 0.5: a removed, c started
  CHECK(ct.changes[1].removed == std::vector<int>{0});
  CHECK(ct.changes[2].ms == 1000);  // c ready after the delay
  CHECK(ct.changes[2].ready == std::vector<int>{2});
  CHECK(ct.changes[3].ms == 2000);
  CHECK(ct.changes[3].removed == std::vector<int>{1});
  CHECK(ct.changes[4].ms == 2500);
  CHECK(ct.changes[4].ready == std::vector<int>{3});
  CHECK(ct.most_alive == 2);
}

TEST_CASE("replay schedule: no slots or no events is refused") {
  CHECK_THROWS_AS(schedule_of("0,add,a\n", 0), oobleck::messages::input_error);
  CHECK_THROWS_AS(schedule_of("", 2), oobleck::messages::input_error);
}
