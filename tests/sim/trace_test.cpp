#include "sim/trace.hpp"

#include <doctest/doctest.h>

#include "messages/input_error.hpp"

using namespace oobleck::sim;
using oobleck::messages::input_error;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_trace(text, "t.csv");
  } catch (const input_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("a trace parses with CRLF line ends and blank lines, in time order with adds before removes") {
  // The remove of b at 50 comes before its add in the file; at equal times adds go first.
  const auto events = parse_trace("0,add,a\r\n\r\n50,remove,b\r\n50,add,b\r\n20,add,c\r\n", "t.csv");
  REQUIRE(events.size() == 4);
  CHECK(events[0].node == "a");
  CHECK(events[1].node == "c");
  CHECK(events[1].ms == 20);
  CHECK(events[2].node == "b");
  CHECK(events[2].action == trace_action::add);
  CHECK(events[3].action == trace_action::remove);
  CHECK(events[3].line == 3);
}

TEST_CASE("bad traces name the line and the problem") {
  CHECK(error_of("0,add,a\n10,remove,x\n") ==
        "t.csv line 2: node 'x' is removed at 10 ms but is not present (never added, or already removed)");
  CHECK(error_of("0,add,a\n-5,add,b\n").find("t.csv line 2: negative time -5") == 0);
  CHECK(error_of("0,add,a\n10,add,b\nhello world\n").find("t.csv line 3: 1 fields") == 0);
  CHECK(error_of("0,add,a\n1.5,add,b\n").find("t.csv line 2: time is not an integer") == 0);
  CHECK(error_of("0,join,a\n").find("t.csv line 1: unknown action 'join'") == 0);
  CHECK(error_of("0,add,\n").find("t.csv line 1: empty node name") == 0);
  CHECK(error_of("0,add,a\n5,add,a\n") == "t.csv line 2: node 'a' is added at 5 ms while it is already present");
  CHECK(error_of("0,add,a,extra\n").find("t.csv line 1: 4 fields") == 0);
  CHECK(error_of("99999999999999999999,add,a\n").find("t.csv line 1: time out of range") == 0);
}

TEST_CASE("nodes are ready after the delay, the starting cluster at once, one removed before ready is never seen") {
  const auto events = parse_trace("0,add,a\n0,add,b\n1000,add,c\n2000,add,d\n30000,remove,d\n60000,remove,a\n", "t");
  const auto t = to_cluster_trace(events, {.ready_delay_ms = 45000});
  REQUIRE(t.changes.size() == 3);
  CHECK(t.changes[0].ms == 0);
  CHECK(t.changes[0].ready == std::vector<int>{0, 1});
  CHECK(t.changes[1].ms == 46000);  // c, added at 1000
  CHECK(t.changes[1].ready == std::vector<int>{2});
  CHECK(t.changes[2].ms == 60000);
  CHECK(t.changes[2].removed == std::vector<int>{0});
  CHECK(t.names == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(t.end_ms == 60000);
  CHECK(t.most_alive == 3);

  SUBCASE("the artifacts' way: the starting cluster waits too") {
    const auto u = to_cluster_trace(events, {.ready_delay_ms = 45000, .initial_nodes_ready = false});
    CHECK(u.changes[0].ms == 45000);
    CHECK(u.changes[0].ready == std::vector<int>{0, 1});
  }
  SUBCASE("time scale shrinks the trace, not the delay") {
    const auto u = to_cluster_trace(events, {.ready_delay_ms = 100, .time_scale = 0.01});
    CHECK(u.changes[1].ms == 110);  // c: 1000 x 0.01 + 100
    CHECK(u.end_ms == 600);
    CHECK(u.most_alive == 4);  // d is ready at 120, removed at 300
  }
}

TEST_CASE("a node ready and removed at the same time is ready first, a re-added name is a new node") {
  const auto t = to_cluster_trace(parse_trace("0,add,a\n10,add,b\n55,remove,b\n70,add,b\n", "t"),
                                  {.ready_delay_ms = 45});
  REQUIRE(t.changes.size() == 3);
  CHECK(t.changes[1].ms == 55);
  CHECK(t.changes[1].ready == std::vector<int>{1});
  CHECK(t.changes[1].removed == std::vector<int>{1});
  CHECK(t.changes[2].ready == std::vector<int>{2});
  CHECK(t.names[2] == "b");
}
