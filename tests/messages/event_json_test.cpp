#include "messages/event_json.hpp"

#include <doctest/doctest.h>

#include "messages/input_error.hpp"
#include "messages/protocol.hpp"

using namespace oobleck::messages;

TEST_CASE("event json: every kind and outcome survives a line, and other lines are not events") {
  for (int k = 0; k <= static_cast<int>(event_kind::node_refused); ++k) {
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
