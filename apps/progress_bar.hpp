#pragma once
// oobleck-local's progress bar: one line, rewritten in place ('\r', then erase to the end of the
// line) when stdout is a terminal, kept below the program's other lines; where stdout is not a
// terminal (a file, a pipe, a test, CI) nothing of it is printed and the lines are as they were.

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>

namespace oobleck::apps {

/// What the bar shows.
struct progress_figures {
  std::int64_t done = 0;   ///< steps committed (the newest committed step + 1)
  std::int64_t total = 0;  ///< the job's steps; 0: unknown (a trace replay): no bar, no ETA
  double loss = 0;
  std::optional<double> samples_per_second;  ///< none until two commits were seen
  std::optional<double> eta_s;
};

/// "[#####-----] 12/20  60%  loss 3.214  412.5 samples/s  ETA 0:03" in `width` columns at most
/// (the bar shrinks first; below ~50 columns, only the figures).
std::string progress_bar_line(const progress_figures& f, int width = 80);

/// Figures from the commits seen: samples/s and the ETA over the last `window` commits.
class progress_meter {
 public:
  progress_meter(std::int64_t total_steps, std::int64_t global_batch, std::size_t window = 10)
      : total_(total_steps), batch_(global_batch), window_(window < 2 ? 2 : window) {}
  /// Step `step` (0-based) committed at `unix_ms` with `loss`.
  void committed(std::uint64_t step, double loss, double unix_ms);
  [[nodiscard]] progress_figures figures() const { return figures_; }

 private:
  std::int64_t total_, batch_;
  std::size_t window_;
  std::deque<double> times_ms_;
  progress_figures figures_;
};

/// Where oobleck-local's lines go: with a bar (a terminal), each line is written above it and the
/// bar redrawn below; without one, each line as it is. Thread-safe (the echo, the event tail and
/// the main thread all write).
class console {
 public:
  console(std::ostream& out, bool bar) : out_(out), bar_(bar) {}
  ~console() { end_bar(); }
  console(const console&) = delete;
  console& operator=(const console&) = delete;

  [[nodiscard]] bool has_bar() const { return bar_; }
  void line(const std::string& text);
  /// Redraws the bar (a terminal only).
  void bar(const std::string& text);
  /// Leaves the bar as the last line written: what follows (an error on stderr, the shell's
  /// prompt) starts on a line of its own.
  void end_bar();

 private:
  std::mutex mutex_;
  std::ostream& out_;
  bool bar_;
  std::string shown_;  ///< the bar on screen now; empty: none
};

/// stdout's terminal's width in columns (80 when it does not say).
int terminal_columns();

/// Whether oobleck-local draws the bar: stdout is a terminal that is not TERM=dumb.
bool stdout_wants_bar();

}  // namespace oobleck::apps
