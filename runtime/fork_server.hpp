#pragma once
// A fork server: a program that has loaded its libraries once starts copies of itself by fork
// instead of exec. oobleck-local starts its workers this way: loading LibTorch and the ~290
// libraries it needs costs a worker ~1 s of CPU (the dynamic loader's look-ups, LibTorch's operator
// registration), which six workers on two cores, and every replacement, would otherwise pay again.
// No LibTorch, no CAF.
//
// The server is a child of the client, started with fork_server_variable naming its socket. For
// each start it forks twice: the copy is orphaned at once and adopted by the client, which has made
// itself a subreaper (PR_SET_CHILD_SUBREAPER). The copy is then the client's own child: the client
// signals it, waits for it and reads its exit status as for any program it started
// (runtime::child_process). The copy runs the program's main on the arguments it was given, with the
// streams it was given, /proc/PID/cmdline showing those arguments.
//
// A copy is a fork of a process with a single thread that has run no main: it inherits the
// server's environment (the client's, as when the server started) and its libraries' state after
// their static initialisation, nothing else. The server refuses to serve when a library started
// a thread at load (OpenBLAS without OPENBLAS_NUM_THREADS=1 does), since a fork keeps only the
// forking thread.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/child_process.hpp"

namespace oobleck::runtime {

/// The environment variable that makes a program a fork server: the descriptor of its socket.
inline constexpr const char* fork_server_variable = "OOBLECK_FORK_SERVER";

/// The server's socket when this process was started as a fork server, else none. The variable is
/// removed from the environment (the copies do not see it).
std::optional<int> fork_server_socket();

/// The server's loop on `socket` (from fork_server_socket). Each copy runs `main_fn` on its argv
/// (argv[0] included) and exits with what it returns. With `exit_with_client`, a copy is killed
/// (SIGKILL) when the client ends. `argc`, `argv` are the server's own: the copies write their
/// arguments over them for /proc/PID/cmdline. Returns the server's exit status: 0 once the client
/// has closed its end.
int serve_forks(int socket, int (*main_fn)(int, char**), bool exit_with_client, int argc, char** argv);

/// The client's side: a fork server of the program at `path`, started by the constructor.
/// Thread-safe.
class fork_server {
 public:
  /// Makes this process a subreaper, starts `path` as a fork server (its output where `streams`
  /// say; the environment as child_process gives it, `env_defaults` included) and waits until it
  /// serves. Throws child_spawn_error when it cannot start, does not answer within `ready_timeout`,
  /// or refuses (the reason).
  fork_server(const std::string& path, const child_streams& streams, const std::vector<std::string>& env_defaults,
              std::chrono::milliseconds ready_timeout = std::chrono::seconds(60));
  /// Ends the server (its copies go on: they are this process's children).
  ~fork_server();
  fork_server(const fork_server&) = delete;
  fork_server& operator=(const fork_server&) = delete;

  /// Starts a copy with argv `path, args...` and the streams (stdin /dev/null, descriptor 3 not
  /// given). Throws child_spawn_error when the server cannot: it is gone, the fork failed, or the
  /// arguments need more room than its command line has (title_capacity()).
  child_process start(const std::vector<std::string>& args, const child_streams& streams);

  /// The longest command line, NULs included, that a copy can show in /proc/PID/cmdline.
  [[nodiscard]] std::size_t title_capacity() const { return capacity_; }
  /// The server's pid.
  [[nodiscard]] pid_t pid() const { return server_->pid(); }
  /// Whether the server has stopped answering (it is gone): every later start fails.
  [[nodiscard]] bool gone() {
    std::lock_guard lock(mutex_);
    return broken_;
  }

 private:
  std::string path_;
  std::optional<child_process> server_;
  int socket_ = -1;
  std::size_t capacity_ = 0;
  bool broken_ = false;
  std::mutex mutex_;
};

}  // namespace oobleck::runtime
