#pragma once
// What the benchmarks learn a job did: the coordinator's job events (oobleck-coordinator
// --events-out, oobleck-local --events-out), one JSON line each, appended and flushed as they are
// published. Never the log lines, which are for people and may be reworded (OOBLECK_LOG_PREFIX).
//
// Clock: an event's unix_ms is the system clock of the coordinator's machine when it published the
// event, in milliseconds since the Unix epoch. Every process of a benchmark runs on this machine,
// so a benchmark times a fault or a start it caused against an event by reading the same clock
// (unix_ms_now) just before it acts.

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "messages/event_json.hpp"

namespace oobleck::bench {

using messages::event_kind;
using messages::timed_event;

using messages::unix_ms_now;  ///< the system clock now, in ms since the Unix epoch (timed_event's clock)
/// Sleeps until the system clock reads `unix_ms` (returns at once if it already has).
void sleep_until_unix_ms(double unix_ms);

/// An events file read as it grows: complete lines only, each parsed once (a line that is not an
/// event is skipped; a malformed event throws messages::input_error).
class event_log {
 public:
  /// Follows `path`, which is created empty if it does not exist (so that it can be watched
  /// before the coordinator opens it for appending).
  explicit event_log(std::filesystem::path path);
  ~event_log();
  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;

  /// Reads what has been appended since the last read.
  void read();
  /// The first event at or after index `from` that satisfies pred, reading as the file grows, for
  /// up to timeout_s; none at the timeout, or once `alive` (if given) says the writer is gone and
  /// the file's last events do not satisfy pred either.
  std::optional<std::size_t> wait_for(const std::function<bool(const timed_event&)>& pred, std::size_t from,
                                      double timeout_s, const std::function<bool()>& alive = {});

  /// The events read so far (read() first for the latest).
  [[nodiscard]] const std::vector<timed_event>& events() const { return events_; }
  [[nodiscard]] std::size_t size() const { return events_.size(); }
  [[nodiscard]] const timed_event& operator[](std::size_t i) const { return events_.at(i); }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  /// Blocks until the file is written to or `timeout_ms` passes.
  void wait_for_write(int timeout_ms);

  std::filesystem::path path_;
  int fd_ = -1;       ///< the file, read from offset_
  int notify_ = -1;   ///< inotify on the file (-1: polling)
  std::string partial_;
  std::vector<timed_event> events_;
};

/// Every event of an events file, read once (none if the file does not exist).
std::vector<timed_event> read_events(const std::filesystem::path& path);

/// Kind tests for wait_for.
inline auto is(event_kind k) {
  return [k](const timed_event& e) { return e.event.kind == k; };
}

/// One line for people: "<kind> epoch E step S node N ...".
std::string describe(const timed_event& e);

/// Waits (polling, up to timeout_s) for a file a program writes whole (by a rename), such as
/// oobleck-coordinator's --address-file; its first line, or none at the timeout or once `alive`
/// says the program is gone.
std::optional<std::string> wait_for_file_line(const std::filesystem::path& path, double timeout_s,
                                              const std::function<bool()>& alive = {});

}  // namespace oobleck::bench
