#include "apps/local_events.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "messages/input_error.hpp"

namespace oobleck::apps {

bool registered_in(const std::string& events_path, const std::string& name) {
  std::ifstream in(events_path);
  std::string line;
  while (std::getline(in, line)) {
    try {
      const auto e = messages::parse_event_line(line);
      if (e && e->event.kind == messages::event_kind::node_joined && e->event.detail == name) return true;
    } catch (const messages::input_error&) {  // a line still being written
    }
  }
  return false;
}

event_tail::event_tail(const std::string& path, std::function<void(const messages::timed_event&)> on_event, std::ostream& err)
    : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), on_event_(std::move(on_event)), err_(err) {
  if (fd_ < 0) throw std::runtime_error("cannot read the events file " + path + ": " + std::strerror(errno));
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      read_available();
      lock.lock();
      wake_.wait_for(lock, std::chrono::milliseconds(10), [this] { return stopping_; });
    }
  });
}

event_tail::~event_tail() {
  stop();
  ::close(fd_);
}

void event_tail::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  read_available();
}

void event_tail::read_available() {
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    partial_.append(chunk, static_cast<std::size_t>(n));
  }
  std::vector<messages::timed_event> events;
  for (;;) {
    try {
      messages::take_complete_events(partial_, events);
      break;
    } catch (const messages::input_error& e) {
      err_ << "warning: " << e.what() << "\n";  // a bug of the coordinator's: skip the line, read on
    }
  }
  for (const auto& e : events) on_event_(e);
}

void job_progress::on_event(const messages::timed_event& t) {
  using messages::event_kind;
  const auto& e = t.event;
  if (e.kind == event_kind::node_joined) {
    {
      std::lock_guard lock(names_mutex);
      registered_names.insert(e.detail);
    }
    ++registered;
  } else if (e.kind == event_kind::epoch_formed && !formed) {
    // When it happened, not when this thread read it: the wall-clock age of the event, on the
    // steady clock the trace replay runs on.
    const auto age = std::chrono::duration<double, std::milli>(std::max(0.0, messages::unix_ms_now() - t.unix_ms));
    formed_at = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(age);
    formed = true;
  } else if (e.kind == event_kind::waiting_for_nodes) {
    ++waits;
  } else if (e.kind == event_kind::step_committed) {
    last_step = std::max(last_step.load(), static_cast<std::int64_t>(e.step));
  }
  {
    std::lock_guard lock(wake_mutex_);
    ++events_;
  }
  wake_.notify_all();
}

void job_progress::wait_for_event(std::chrono::milliseconds timeout) {
  std::unique_lock lock(wake_mutex_);
  wake_.wait_for(lock, timeout, [this] { return events_ != events_seen_; });
  events_seen_ = events_;
}

bool job_progress::has_registered(const std::string& name) const {
  std::lock_guard lock(names_mutex);
  return registered_names.count(name) > 0;
}

std::optional<std::string> read_address(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string address;
  if (in && std::getline(in, address) && !address.empty()) return address;
  return std::nullopt;
}

}  // namespace oobleck::apps
