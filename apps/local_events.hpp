#pragma once
// What oobleck-local learns about its job from the coordinator's files (never from its log lines,
// which are for people): the events file followed as it grows, the progress those events tell
// (registrations, the first formed epoch, the last committed step, waits for nodes), and the
// address file.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>

#include "messages/event_json.hpp"

namespace oobleck::apps {

/// Whether the events file records the registration of worker `name` (read whole, now).
bool registered_in(const std::string& events_path, const std::string& name);

/// Follows the coordinator's --events-out file as it grows, on a thread of its own: every complete
/// line that is an event goes to `on_event`, in order; a line still being written waits for its
/// newline. The thread polls (every 10 ms) until stop(), which reads what is left first, so every
/// event the coordinator wrote before it exited is seen.
class event_tail {
 public:
  /// Throws std::runtime_error when the file cannot be opened.
  event_tail(const std::string& path, std::function<void(const messages::timed_event&)> on_event, std::ostream& err);
  ~event_tail();
  event_tail(const event_tail&) = delete;
  event_tail& operator=(const event_tail&) = delete;

  /// Reads the file to its end (the events written so far), then ends the thread.
  void stop();

 private:
  void read_available();

  int fd_;
  std::function<void(const messages::timed_event&)> on_event_;
  std::ostream& err_;
  std::string partial_;  ///< read, not yet a whole line
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

/// What oobleck-local knows about its job, from the coordinator's events.
struct job_progress {
  std::atomic<int> registered{0};              ///< node_joined events
  std::atomic<std::int64_t> last_step{-1};     ///< the newest committed step
  std::atomic<int> waits{0};                   ///< waiting_for_nodes events (below the minimum)
  std::atomic<bool> formed{false};             ///< the first epoch formed (trace time 0) ...
  std::chrono::steady_clock::time_point formed_at{};  ///< ... then (set before `formed`)
  mutable std::mutex names_mutex;
  std::set<std::string> registered_names;      ///< their worker names

  /// Counts one event (called on the event_tail's thread).
  void on_event(const messages::timed_event& t);
  /// Whether worker `name` has registered (its node_joined event was seen).
  bool has_registered(const std::string& name) const;
  /// Waits until an event arrives after the previous call, or `timeout` passes: oobleck-local acts
  /// on a committed step as soon as it is read, not at its next poll (the job's last steps take
  /// ~20 ms each: a --join-at near the end was missed between two polls).
  void wait_for_event(std::chrono::milliseconds timeout);

 private:
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  std::uint64_t events_ = 0;       ///< events counted so far
  std::uint64_t events_seen_ = 0;  ///< ... of which wait_for_event() has returned for
};

/// The address in the coordinator's --address-file, once it exists (written whole, by a rename).
std::optional<std::string> read_address(const std::filesystem::path& file);

}  // namespace oobleck::apps
