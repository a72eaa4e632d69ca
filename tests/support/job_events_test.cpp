// The tests' reader of --events-out files (support/job_events.hpp): only complete lines are events
// (the coordinator may be writing the last one), matching by the fields that are set, and waits
// that end at their deadline or as soon as the job stopped without the event.

#include "support/job_events.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <stdexcept>

#include "messages/event_json.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck::testing;
using namespace oobleck::messages;

namespace {

std::string line_of(const job_event& e) { return event_json({e, 1.7e12}).dump() + "\n"; }

}  // namespace

TEST_CASE("job events: a file's complete lines are its events, a line being written is not one yet") {
  const temp_dir tmp("oobleck-events-");
  const auto path = (tmp.path() / "events.jsonl").string();
  CHECK(read_event_file(path).empty());  // not there yet
  job_event joined{event_kind::node_joined, 0, 0, 3, 0, "w3"};
  job_event lost{event_kind::node_lost, 1, 4, 3, 0, "gone"};
  std::string text = line_of(joined) + line_of(lost);
  const std::string half = line_of({event_kind::step_committed, 1, 4, -1, 2.5, ""});
  {
    std::ofstream out(path, std::ios::binary);
    out << text << "{\"step\": 1}\n" << half.substr(0, half.size() / 2);  // a metrics line, then half an event
  }
  auto events = read_event_file(path);
  REQUIRE(events.size() == 2);
  CHECK(events[0] == joined);
  CHECK(events[1] == lost);
  std::ofstream(path, std::ios::app | std::ios::binary) << half.substr(half.size() / 2);
  events = read_event_file(path);
  REQUIRE(events.size() == 3);
  CHECK(events[2].kind == event_kind::step_committed);
  CHECK(events[2].loss == 2.5);
}

TEST_CASE("job events: a pattern matches by the fields it sets") {
  job_event forming{event_kind::epoch_forming, 2, 5, -1, 0, "simple"};
  forming.lost = {3};
  CHECK(event_match{}(forming));
  CHECK(event_match{.kind = event_kind::epoch_forming, .step = 5}(forming));
  CHECK(event_match{.lost = {{3}}, .joined = {{}}}(forming));
  CHECK(event_match{.detail = "simple"}(forming));
  CHECK_FALSE(event_match{.detail = "borrow"}(forming));
  CHECK_FALSE(event_match{.lost = {{}}}(forming));
  CHECK_FALSE(event_match{.kind = event_kind::epoch_formed}(forming));
  const std::vector<job_event> events{{event_kind::epoch_forming, 1, 0, -1, 0, ""}, forming};
  CHECK(position(events, {.kind = event_kind::epoch_forming}) == 0);
  CHECK(position(events, {.kind = event_kind::epoch_forming}, 1) == 1);
  CHECK(position(events, {.kind = event_kind::stopped}) == events.size());
  CHECK(count(events, {.kind = event_kind::epoch_forming}) == 2);
  CHECK_THROWS_AS(stop_of(events), std::runtime_error);
}

TEST_CASE("job events: a --fail-at node's loss is in the fault's step, or in the previous step's commit that stood") {
  const job_event committed1{event_kind::step_committed, 1, 1, -1, 4.0, ""};
  // In step 2 itself.
  const std::vector<job_event> in_step{committed1, {event_kind::node_lost, 1, 2, 4, 0, "gone"}};
  CHECK(loss_in_step(in_step, 4, 2) == 1);
  CHECK(loss_in_step(in_step, 3, 2) == in_step.size());  // another node
  CHECK(loss_in_step(in_step, 4, 3) == in_step.size());  // another step
  // Run-ahead: node 4 started step 2 with its orders and died while step 1's commit was collected.
  const std::vector<job_event> in_commit{{event_kind::node_lost, 1, 1, 4, 0, "gone"},
                                         {event_kind::commit_stood, 1, 1, 4, 0, ""},
                                         {event_kind::step_committed, 1, 1, -1, 4.0, ""}};
  CHECK(loss_in_step(in_commit, 4, 2) == 0);
  // Lost in step 1 with no commit standing after it: a loss in step 1, not step 2's fault.
  const std::vector<job_event> earlier{{event_kind::node_lost, 1, 1, 4, 0, "gone"}};
  CHECK(loss_in_step(earlier, 4, 2) == earlier.size());
  // The commit that stood names another node.
  const std::vector<job_event> other{{event_kind::node_lost, 1, 1, 4, 0, "gone"}, {event_kind::commit_stood, 1, 1, 3, 0, ""}};
  CHECK(loss_in_step(other, 4, 2) == other.size());
  CHECK(loss_in_step(in_commit, 4, 0) == in_commit.size());  // no step before step 0
}

TEST_CASE("job events: a wait ends at its deadline, or at once when the job stopped without the event") {
  const temp_dir tmp("oobleck-events-");
  const auto path = (tmp.path() / "events.jsonl").string();
  std::ofstream(path) << line_of({event_kind::node_joined, 0, 0, 0, 0, "w0"});
  CHECK(wait_for_event(path, {.kind = event_kind::node_joined, .node = 0}).detail == "w0");
  CHECK(worker_name(path, 0) == "w0");
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(wait_for_event(path, {.kind = event_kind::node_lost}, std::chrono::milliseconds(100)),
                  std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(100));
  job_event stop{event_kind::stopped, 1, 3, -1, 0, "training finished"};
  stop.outcome = stop_outcome::finished;
  stop.committed = 3;
  std::ofstream(path, std::ios::app) << line_of(stop);
  const auto before = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(wait_for_event(path, {.kind = event_kind::node_lost}, std::chrono::seconds(30)), std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(5));
  CHECK(wait_for_event(path, finished(3)).detail == "training finished");
  CHECK_THROWS_AS(wait_for_address((tmp.path() / "none").string(), std::chrono::milliseconds(50)), std::runtime_error);
  std::ofstream(tmp.path() / "address") << "127.0.0.1:4242\n";
  CHECK(wait_for_address((tmp.path() / "address").string()) == "127.0.0.1:4242");
}
