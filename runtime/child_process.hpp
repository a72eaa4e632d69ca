#pragma once
// Child processes: start a program, signal it, wait for its end with a deadline, kill and reap it.
// A child_process owns one child and reaps it on destruction (killing it first if it still runs),
// so no way out of its owner leaves a running program or a zombie behind. No LibTorch, no CAF:
// oobleck-local, the benchmarks and the tests all start their programs with it.
//
// Exit statuses read as a shell reports them: the exit code, or 128 + the signal that ended it.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::runtime {

/// Where a child's stdout or stderr goes.
struct child_output {
  /// This process's own stream.
  static child_output inherit() { return {}; }
  /// A descriptor of this process (an open file, a pipe's write end): the child gets a copy.
  static child_output descriptor(int fd) { return {fd, {}}; }
  /// A file, created or truncated (mode 0600), appended to.
  static child_output file(std::string path) { return {-1, std::move(path)}; }

  int fd = -1;       ///< >= 0: dup'ed onto the stream
  std::string path;  ///< not empty: opened onto the stream; neither: inherited
};

/// A child's streams: stdin is always /dev/null.
struct child_streams {
  child_output out;                 ///< stdout
  std::optional<child_output> err;  ///< stderr; none: where stdout goes
  int fd3 = -1;                     ///< >= 0: a descriptor of this process given to the child as its descriptor 3
};

/// A program could not be started (missing, not executable, an output file not writable).
class child_spawn_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Opens the file a child's stream goes to (child_output::file): created or truncated (mode 0600),
/// appended to, closed on exec (the child gets a copy). Throws child_spawn_error
/// ("cannot start PROGRAM: PATH: REASON").
int open_child_output(const std::string& program, const std::string& path);

/// What /proc/PID/stat says of a process: its state letter (R, S, T, Z, ...) and its parent.
struct process_status {
  char state = 0;
  pid_t parent = -1;
};

/// The status of `pid`; none when it is gone (or /proc cannot be read).
std::optional<process_status> read_process_status(pid_t pid);

/// This process's program (/proc/self/exe), to start copies of it as children. Throws
/// std::runtime_error when it cannot be read.
std::string this_program_path();

/// One child process, owned: killed (if still running) and reaped on destruction.
class child_process {
 public:
  using clock = std::chrono::steady_clock;

  /// Starts `path` (no PATH search) with argv `path, args...` and this process's environment, plus
  /// each `NAME=VALUE` of `env_defaults` whose NAME this process's environment does not have (a value
  /// the user set wins). Throws child_spawn_error ("cannot start PATH: REASON").
  child_process(const std::string& path, const std::vector<std::string>& args, const child_streams& streams = {},
                const std::vector<std::string>& env_defaults = {});
  /// Owns `pid`, a child of this process that it did not start itself: an orphan that this process
  /// adopted as a subreaper (runtime::fork_server).
  static child_process adopt(pid_t pid);
  ~child_process();
  child_process(child_process&& other) noexcept;
  child_process& operator=(child_process&& other) noexcept;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  /// Whether its end has been collected (by poll, a wait or kill_and_reap).
  [[nodiscard]] bool reaped() const { return reaped_; }
  /// Once reaped: whether a signal ended it (its status is then 128 + the signal).
  [[nodiscard]] bool signalled() const { return reaped_ && signalled_; }
  /// Whether it is stopped (SIGSTOP; state T or t in /proc/PID/stat).
  [[nodiscard]] bool stopped() const;

  /// Sends `sig`; nothing once reaped (the pid may belong to another process by then).
  void signal(int sig) const;
  /// Non-blocking: its status once it has exited, else none.
  std::optional<int> poll();
  /// Its status once it has exited, or none if it still runs at `deadline`.
  std::optional<int> wait_until(clock::time_point deadline);
  /// Blocks until it exits; its status.
  int wait();
  /// SIGKILL (and SIGCONT, for a stopped one), then its status. Its status alone once reaped.
  int kill_and_reap() noexcept;

 private:
  child_process() = default;
  void record(int wait_status);

  pid_t pid_ = -1;
  bool reaped_ = true;  // a moved-from owner owns nothing
  bool signalled_ = false;
  int status_ = -1;
};

/// A pipe that a child writes its output into (child_output::descriptor(write_end())) and this
/// process reads line by line. Both ends close on exec, so no other child holds the write end;
/// close_write_end() after the spawn, so that reading ends when the child (and whatever inherited
/// its stream) has closed it.
class output_pipe {
 public:
  using clock = std::chrono::steady_clock;

  output_pipe();  ///< throws std::runtime_error
  ~output_pipe();
  output_pipe(const output_pipe&) = delete;
  output_pipe& operator=(const output_pipe&) = delete;

  [[nodiscard]] int write_end() const { return write_; }
  void close_write_end();

  /// Reads to the end, each complete line (without its '\n') to on_line as it arrives; a last
  /// line without '\n' is dropped.
  void read_lines(const std::function<void(const std::string&)>& on_line);
  /// The same, but returns false at `deadline` if the end has not come (true at the end); a
  /// later call goes on where this one stopped.
  bool read_lines_until(clock::time_point deadline, const std::function<void(const std::string&)>& on_line);

 private:
  void read_some(int timeout_ms, const std::function<void(const std::string&)>& on_line);

  int read_ = -1, write_ = -1;
  bool ended_ = false;
  std::string pending_;
};

}  // namespace oobleck::runtime
