#include "apps/progress_bar.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace oobleck::apps {

namespace {

std::string duration_text(double s) {
  const auto total = static_cast<long long>(std::llround(std::max(0.0, s)));
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", total / 60, total % 60);
  return buf;
}

constexpr const char* erase_line = "\r\033[K";  // to the line's start, then erase to its end

}  // namespace

std::string progress_bar_line(const progress_figures& f, int width) {
  char buf[160];
  std::string figures;
  if (f.total > 0) {
    const double share = std::clamp(static_cast<double>(f.done) / static_cast<double>(f.total), 0.0, 1.0);
    std::snprintf(buf, sizeof buf, "%lld/%lld %3.0f%%", static_cast<long long>(f.done), static_cast<long long>(f.total),
                  100 * share);
  } else {
    std::snprintf(buf, sizeof buf, "step %lld", static_cast<long long>(f.done));
  }
  figures += buf;
  if (f.done > 0) {
    std::snprintf(buf, sizeof buf, "  loss %.4g", f.loss);
    figures += buf;
  }
  if (f.samples_per_second) {
    std::snprintf(buf, sizeof buf, "  %.1f samples/s", *f.samples_per_second);
    figures += buf;
  }
  if (f.total > 0) figures += "  ETA " + (f.eta_s ? duration_text(*f.eta_s) : std::string("--:--"));
  // The bar takes what the figures leave, between 10 and 40 columns; without room, none.
  const int room = width - 1 - static_cast<int>(figures.size()) - 3;
  if (f.total <= 0 || room < 10) return figures.substr(0, static_cast<std::size_t>(std::max(0, width - 1)));
  const int cells = std::min(40, room);
  const double share = std::clamp(static_cast<double>(f.done) / static_cast<double>(f.total), 0.0, 1.0);
  const int full = static_cast<int>(std::floor(share * cells));
  return "[" + std::string(static_cast<std::size_t>(full), '#') + std::string(static_cast<std::size_t>(cells - full), '-') +
         "] " + figures;
}

void progress_meter::committed(std::uint64_t step, double loss, double unix_ms) {
  figures_.total = total_;
  figures_.done = static_cast<std::int64_t>(step) + 1;
  figures_.loss = loss;
  times_ms_.push_back(unix_ms);
  if (times_ms_.size() > window_) times_ms_.pop_front();
  const double span_ms = times_ms_.back() - times_ms_.front();
  if (times_ms_.size() >= 2 && span_ms > 0) {
    const double steps_per_s = 1000.0 * static_cast<double>(times_ms_.size() - 1) / span_ms;
    figures_.samples_per_second = steps_per_s * static_cast<double>(batch_);
    if (total_ > 0) figures_.eta_s = static_cast<double>(std::max<std::int64_t>(0, total_ - figures_.done)) / steps_per_s;
  }
}

void console::line(const std::string& text) {
  std::lock_guard lock(mutex_);
  if (!shown_.empty()) {
    out_ << erase_line << text << "\n" << shown_ << std::flush;
  } else {
    out_ << text << std::endl;
  }
}

void console::bar(const std::string& text) {
  if (!bar_) return;
  std::lock_guard lock(mutex_);
  if (text == shown_) return;
  shown_ = text;
  out_ << erase_line << shown_ << std::flush;
}

void console::end_bar() {
  std::lock_guard lock(mutex_);
  if (shown_.empty()) return;
  out_ << "\n" << std::flush;
  shown_.clear();
}

bool stdout_wants_bar() {
  if (!::isatty(STDOUT_FILENO)) return false;
  const char* term = std::getenv("TERM");
  return !(term && std::strcmp(term, "dumb") == 0);
}

}  // namespace oobleck::apps

namespace oobleck::apps {

int terminal_columns() {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

}  // namespace oobleck::apps
