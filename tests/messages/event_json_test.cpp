#include "messages/event_json.hpp"

#include <doctest/doctest.h>

#include "messages/input_error.hpp"
#include "messages/protocol.hpp"

using namespace oobleck::messages;

TEST_CASE("event json: every kind and outcome survives a line, and other lines are not events") {
  for (int k = 0; k <= static_cast<int>(event_kind::resumed); ++k) {
    timed_event t;
    t.event.kind = static_cast<event_kind>(k);
    t.event.epoch = 3;
    t.event.step = 41;
    t.event.node = k == 1 ? 7 : -1;
    t.event.loss = 2.5;
    t.event.detail = "why \"quoted\"";
    t.event.lost = {2, 4};
    t.event.joined = {9};
    t.event.outcome = static_cast<stop_outcome>(k % 5);
    t.event.committed = 40;
    t.unix_ms = 1.7e12 + 0.25;
    const auto line = event_json(t).dump();
    const auto back = parse_event_line(line);
    REQUIRE(back);
    CHECK(back->event == t.event);
    CHECK(back->unix_ms == t.unix_ms);
    CHECK(event_kind_named(to_string(t.event.kind)) == t.event.kind);
  }
  CHECK_FALSE(parse_event_line(""));
  CHECK_FALSE(parse_event_line(R"({"step": 3, "loss": 1.0})"));            // a step record
  CHECK_FALSE(parse_event_line(R"({"event": "reconfigured", "epoch": 2})"));  // a metrics record
  CHECK_FALSE(parse_event_line("[coordinator] step 3: loss 1.0"));           // a log line
  CHECK_THROWS_AS(parse_event_line(R"({"event": "node_lost", "epoch": 2})"), input_error);
  auto bad = event_json({job_event{}, 0});
  bad["outcome"] = "gone";
  CHECK_THROWS_AS(parse_event_line(bad.dump()), input_error);
}

TEST_CASE("event json: a file read in pieces gives each complete line's event once, a malformed one refused in place") {
  const auto line = [](event_kind k, std::uint64_t step) {
    timed_event t;
    t.event.kind = k;
    t.event.step = step;
    return event_json(t).dump() + "\n";
  };
  const std::string first = line(event_kind::node_joined, 0), second = line(event_kind::step_committed, 1);
  std::vector<timed_event> out;
  std::string buffer = first + second.substr(0, 10);  // the second line still being written
  take_complete_events(buffer, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].event.kind == event_kind::node_joined);
  CHECK(buffer == second.substr(0, 10));
  buffer += second.substr(10) + "[coordinator] not an event\n";
  take_complete_events(buffer, out);
  REQUIRE(out.size() == 2);
  CHECK(out[1].event.step == 1);
  CHECK(buffer.empty());
  // A malformed event: the events before it delivered, it and they consumed, the rest left to read.
  buffer = first + R"({"event": "node_lost", "epoch": 2})" "\n" + second;
  CHECK_THROWS_AS(take_complete_events(buffer, out), input_error);
  CHECK(out.size() == 3);
  CHECK(buffer == second);
  take_complete_events(buffer, out);
  CHECK(out.size() == 4);
  CHECK(buffer.empty());
}
