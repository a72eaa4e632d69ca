#pragma once
// The coordinator's job events as JSON lines (oobleck-coordinator --events-out, oobleck-local
// --events-out): the machine-readable account of what a job did, which programs, benchmarks and
// tests read instead of the coordinator's log lines (those are for people and may be reworded).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/control_messages.hpp"

namespace oobleck::messages {

/// One event with the wall-clock time it was published at (milliseconds since the Unix epoch).
struct timed_event {
  job_event event;
  double unix_ms = 0;
};

/// {"event": "<kind>", "unix_ms", "epoch", "step", "node", "loss", "detail", "lost", "joined",
/// "outcome", "committed"}: every field, whatever the kind.
nlohmann::ordered_json event_json(const timed_event& e);

/// The event of one line written by event_json; nullopt for a line that is not one (empty, or
/// another record); throws input_error for a line that claims to be an event and is malformed.
std::optional<timed_event> parse_event_line(std::string_view line);

/// The events file as it grows, read in pieces: appends to `out` the event of every complete line
/// of `buffer` (what has been read so far) and removes those lines from it; a last line without its
/// newline (still being written) stays for the next read, and lines that are not events are
/// skipped. A malformed event line is removed with the lines before it, and input_error is thrown:
/// the events before it are in `out`, and a caller that goes on calls again for the rest.
void take_complete_events(std::string& buffer, std::vector<timed_event>& out);

/// The kind named `name` (to_string's spelling); nullopt for none.
std::optional<event_kind> event_kind_named(std::string_view name);

/// Milliseconds since the Unix epoch, now (the clock of timed_event::unix_ms).
double unix_ms_now();

}  // namespace oobleck::messages
