#pragma once
// A program running in the background for multi-process tests: its stdout and stderr go to a log
// file the test reads while it runs. Every wait has a deadline and fails the test instead of
// hanging; the destructor kills (SIGKILL, and SIGCONT for a frozen one) and reaps the process.
// What a job did is learnt from its events (support/job_events.hpp), never from this output: log
// lines are for people, and the suite runs with every one of them reworded (OOBLECK_LOG_PREFIX).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "runtime/child_process.hpp"

namespace oobleck::testing {

class background_process {
 public:
  background_process(const std::string& path, const std::vector<std::string>& args);
  ~background_process();
  background_process(const background_process&) = delete;
  background_process& operator=(const background_process&) = delete;

  /// Everything it printed so far (for failure messages, and checks of what a user is told).
  [[nodiscard]] std::string output() const;
  /// Waits until a line containing `text` was printed; returns that line. Throws
  /// std::runtime_error (with the output so far) at the deadline. Only for a program whose printed
  /// output is itself what the test checks (an example program that prints what it receives).
  std::string wait_for_output(const std::string& text,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Waits for the exit: the exit status, or 128 + signal. Throws at the deadline.
  int wait_exit(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void signal(int sig);
  [[nodiscard]] pid_t pid() const { return child_.pid(); }

 private:
  std::string log_path_;
  runtime::child_process child_;
};

/// The child of `parent` started with `--name NAME` (a worker of oobleck-local), or -1.
pid_t child_named(pid_t parent, const std::string& name);

/// The arguments of process `pid`, program first, as /proc/PID/cmdline shows them; empty ones left
/// out (a fork server's copy pads the area it wrote its arguments into with NULs). Empty when
/// there is no such process.
std::vector<std::string> command_line(pid_t pid);

/// Every process whose parent is `parent`, as /proc shows them now.
std::vector<pid_t> children_of(pid_t parent);

/// The state of process `pid` as /proc shows it ('R', 'S', 'T' when stopped, 'Z', ...); 0 when
/// there is no such process.
char process_state(pid_t pid);

/// The TCP ports process `pid` listens on (IPv4 and IPv6), as /proc shows its sockets.
std::set<std::uint16_t> listening_ports(pid_t pid);

}  // namespace oobleck::testing
