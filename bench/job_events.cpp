#include "bench/job_events.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "messages/protocol.hpp"

namespace fs = std::filesystem;

namespace oobleck::bench {

void sleep_until_unix_ms(double unix_ms) {
  const auto at = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double, std::milli>(unix_ms)));
  std::this_thread::sleep_until(at);
}

event_log::event_log(fs::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw std::runtime_error("cannot open the events file " + path_.string());
  notify_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (notify_ >= 0 && ::inotify_add_watch(notify_, path_.c_str(), IN_MODIFY) < 0) {
    ::close(notify_);
    notify_ = -1;  // polling instead
  }
}

event_log::~event_log() {
  if (notify_ >= 0) ::close(notify_);
  if (fd_ >= 0) ::close(fd_);
}

void event_log::read() {
  char chunk[1 << 14];
  for (;;) {
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n <= 0) break;
    partial_.append(chunk, static_cast<std::size_t>(n));
  }
  messages::take_complete_events(partial_, events_);
}

void event_log::wait_for_write(int timeout_ms) {
  if (notify_ < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 2)));
    return;
  }
  pollfd p{notify_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) > 0) {
    char drain[4096];
    while (::read(notify_, drain, sizeof drain) > 0) {
    }
  }
}

std::optional<std::size_t> event_log::wait_for(const std::function<bool(const timed_event&)>& pred, std::size_t from,
                                               double timeout_s, const std::function<bool()>& alive) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(timeout_s));
  std::size_t i = from;
  for (;;) {
    read();
    for (; i < events_.size(); ++i)
      if (pred(events_[i])) return i;
    const bool gone = alive && !alive();
    if (gone) {  // what it wrote before it went is in the file now
      read();
      for (; i < events_.size(); ++i)
        if (pred(events_[i])) return i;
      return std::nullopt;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    // At most 50 ms at a time: `alive` is asked between waits.
    wait_for_write(static_cast<int>(std::min<std::int64_t>(left.count(), 50)));
  }
}

std::vector<timed_event> read_events(const fs::path& path) {
  std::vector<timed_event> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (auto e = messages::parse_event_line(l)) out.push_back(std::move(*e));
  return out;
}

std::string describe(const timed_event& t) {
  const auto& e = t.event;
  std::ostringstream s;
  s << messages::to_string(e.kind) << " epoch " << e.epoch << " step " << e.step;
  if (e.node >= 0) s << " node " << e.node;
  auto list = [&](const char* what, const std::vector<std::int64_t>& ids) {
    if (ids.empty()) return;
    s << " " << what;
    for (auto id : ids) s << " " << id;
  };
  list("lost", e.lost);
  list("joined", e.joined);
  if (e.kind == event_kind::stopped) s << " " << messages::to_string(e.outcome) << ", " << e.committed << " committed";
  if (!e.detail.empty()) s << ": " << e.detail;
  return s.str();
}

std::optional<std::string> wait_for_file_line(const fs::path& path, double timeout_s, const std::function<bool()>& alive) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(timeout_s));
  for (;;) {
    if (std::ifstream in(path); in) {
      std::string line;
      if (std::getline(in, line) && !line.empty()) return line;
    }
    if ((alive && !alive()) || std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace oobleck::bench
