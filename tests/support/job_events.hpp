#pragma once
// What tests learn about a job: the coordinator's typed events (messages::job_event), never its log
// lines, which are for people and may be reworded freely (every test runs with OOBLECK_LOG_PREFIX
// set to prove it). The deterministic protocol tests collect them through coordinator_deps::on_event;
// the multi-process tests read the file of `oobleck-coordinator --events-out` / `oobleck-local
// --events-out` (one JSON line per event, flushed as it happens).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "messages/control_messages.hpp"

namespace oobleck::testing {

/// A pattern of events: every field that is set must equal the event's. With designated
/// initializers: `{.kind = event_kind::epoch_forming, .step = 1, .lost = {{3}}}`.
struct event_match {
  std::optional<messages::event_kind> kind;
  std::optional<std::uint64_t> epoch;
  std::optional<std::uint64_t> step;
  std::optional<std::int64_t> node;
  std::optional<std::string> detail;
  std::optional<std::vector<std::int64_t>> lost;
  std::optional<std::vector<std::int64_t>> joined;
  std::optional<messages::stop_outcome> outcome;
  std::optional<std::uint64_t> committed;

  bool operator()(const messages::job_event& e) const;
};

/// One line per event, e.g. "epoch_forming epoch 2 step 1 lost [3] joined [] detail 'simple'".
std::string describe(const messages::job_event& e);
std::string describe(const std::vector<messages::job_event>& events);
std::string describe(const event_match& m);

/// Where the first event matching `m` at or after `from` stands; events.size() when none does.
std::size_t position(const std::vector<messages::job_event>& events, const event_match& m, std::size_t from = 0);
bool contains(const std::vector<messages::job_event>& events, const event_match& m);
std::size_t count(const std::vector<messages::job_event>& events, const event_match& m);
/// Every event matching `m`, in order.
std::vector<messages::job_event> all_of(const std::vector<messages::job_event>& events, const event_match& m);

/// Where the loss of `node` stands when its --fail-at fault fired in the middle of step `step`: its
/// node_lost event of step `step`, or one of step `step - 1` that the step's commit outlived (a
/// commit_stood of step - 1 naming the node after it). The second is run-ahead's: step `step`'s
/// orders ride with step `step - 1`'s commit, so the node can start step `step`, and die in it, while
/// the coordinator still collects that commit's acknowledgements. events.size() when neither.
std::size_t loss_in_step(const std::vector<messages::job_event>& events, std::int64_t node, std::uint64_t step);

/// The job's `stopped` event (there must be exactly one; throws std::runtime_error otherwise).
const messages::job_event& stop_of(const std::vector<messages::job_event>& events);

/// A job that finished: one `stopped` event, outcome finished, `steps` steps committed by the run.
event_match finished(std::uint64_t steps);

// ---- files written by --events-out and --address-file ------------------------------------------

/// Every event in the file so far (none when it does not exist yet); a last line without its newline
/// (being written) is left out. Throws messages::input_error for a malformed event line.
std::vector<messages::job_event> read_event_file(const std::string& path);

/// Waits until the file holds an event matching `m` and returns the first one. Throws
/// std::runtime_error at the deadline naming `m` and listing the events so far, and as soon as a
/// `stopped` event is there without a match before it (the job ended without it).
messages::job_event wait_for_event(const std::string& path, const event_match& m,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// The worker name of node `node` (its node_joined event's detail), waited for as wait_for_event.
std::string worker_name(const std::string& events_path, std::int64_t node,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// The HOST:PORT of `--address-file FILE`, waited for until the deadline (throws then).
std::string wait_for_address(const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace oobleck::testing
