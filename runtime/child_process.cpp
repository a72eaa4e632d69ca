#include "runtime/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

extern char** environ;

namespace oobleck::runtime {

namespace {

/// posix_spawn's file actions, destroyed on every way out, with the output files opened for them.
class file_actions {
 public:
  explicit file_actions(const std::string& program) : program_(program) { posix_spawn_file_actions_init(&a_); }
  ~file_actions() {
    posix_spawn_file_actions_destroy(&a_);
    for (int fd : opened_) ::close(fd);
  }
  file_actions(const file_actions&) = delete;
  file_actions& operator=(const file_actions&) = delete;
  posix_spawn_file_actions_t* get() { return &a_; }

  /// `target` (1 or 2) goes where `o` says. A file is opened here, so that one that cannot be
  /// names itself rather than the program.
  void direct(int target, const child_output& o) {
    if (o.fd >= 0) {
      posix_spawn_file_actions_adddup2(&a_, o.fd, target);
    } else if (!o.path.empty()) {
      opened_.push_back(open_child_output(program_, o.path));
      posix_spawn_file_actions_adddup2(&a_, opened_.back(), target);
    }
  }

 private:
  posix_spawn_file_actions_t a_;
  const std::string& program_;
  std::vector<int> opened_;
};

}  // namespace

int open_child_output(const std::string& program, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) throw child_spawn_error("cannot start " + program + ": " + path + ": " + std::strerror(errno));
  return fd;
}

child_process::child_process(const std::string& path, const std::vector<std::string>& args,
                             const child_streams& streams, const std::vector<std::string>& env_defaults) {
  std::vector<char*> argv{const_cast<char*>(path.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  file_actions actions(path);
  posix_spawn_file_actions_addopen(actions.get(), 0, "/dev/null", O_RDONLY, 0);
  actions.direct(1, streams.out);
  if (streams.err) {
    actions.direct(2, *streams.err);
  } else if (streams.out.fd >= 0 || !streams.out.path.empty()) {
    posix_spawn_file_actions_adddup2(actions.get(), 1, 2);  // one open file: both streams append to it
  }
  if (streams.fd3 >= 0) posix_spawn_file_actions_adddup2(actions.get(), streams.fd3, 3);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& d : env_defaults) {
    const auto eq = d.find('=');
    if (eq == 0 || eq == std::string::npos) throw std::invalid_argument("child_process: '" + d + "' is not NAME=VALUE");
    if (std::getenv(d.substr(0, eq).c_str()) == nullptr) envp.push_back(const_cast<char*>(d.c_str()));
  }
  envp.push_back(nullptr);
  const int rc = posix_spawn(&pid_, path.c_str(), actions.get(), nullptr, argv.data(), envp.data());
  if (rc != 0) throw child_spawn_error("cannot start " + path + ": " + std::strerror(rc));
  reaped_ = false;
}

child_process child_process::adopt(pid_t pid) {
  child_process c;
  c.pid_ = pid;
  c.reaped_ = false;
  return c;
}

child_process::~child_process() { kill_and_reap(); }

child_process::child_process(child_process&& other) noexcept
    : pid_(other.pid_), reaped_(other.reaped_), signalled_(other.signalled_), status_(other.status_) {
  other.reaped_ = true;
}

child_process& child_process::operator=(child_process&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pid_ = other.pid_;
    reaped_ = other.reaped_;
    signalled_ = other.signalled_;
    status_ = other.status_;
    other.reaped_ = true;
  }
  return *this;
}

std::string this_program_path() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

std::optional<process_status> read_process_status(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const auto close = line.rfind(')');  // the command name may hold anything, ')' included
  if (close == std::string::npos || close + 2 >= line.size()) return std::nullopt;
  std::istringstream fields(line.substr(close + 2));
  process_status s;
  if (!(fields >> s.state >> s.parent)) return std::nullopt;
  return s;
}

bool child_process::stopped() const {
  if (reaped_) return false;
  const auto s = read_process_status(pid_);
  return s && (s->state == 'T' || s->state == 't');
}

void child_process::signal(int sig) const {
  if (!reaped_) ::kill(pid_, sig);
}

void child_process::record(int wait_status) {
  reaped_ = true;
  signalled_ = WIFSIGNALED(wait_status);
  status_ = signalled_ ? 128 + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}

std::optional<int> child_process::poll() {
  if (reaped_) return status_;
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r < 0) throw std::system_error(errno, std::generic_category(), "waitpid " + std::to_string(pid_));
  if (r == 0) return std::nullopt;
  record(status);
  return status_;
}

std::optional<int> child_process::wait_until(clock::time_point deadline) {
  for (;;) {
    if (const auto s = poll()) return s;
    const auto now = clock::now();
    if (now >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::min<clock::duration>(deadline - now, std::chrono::milliseconds(10)));
  }
}

int child_process::wait() {
  if (reaped_) return status_;
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r < 0) throw std::system_error(errno, std::generic_category(), "waitpid " + std::to_string(pid_));
  record(status);
  return status_;
}

int child_process::kill_and_reap() noexcept {
  if (reaped_) return status_;
  // SIGKILL first: a stopped child woken by SIGCONT then runs none of its own code.
  ::kill(pid_, SIGKILL);
  ::kill(pid_, SIGCONT);
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r < 0) {  // reaped elsewhere (SIGCHLD ignored): nothing left to collect
    reaped_ = true;
    return status_;
  }
  record(status);
  return status_;
}

output_pipe::output_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  read_ = fds[0];
  write_ = fds[1];
}

output_pipe::~output_pipe() {
  close_write_end();
  if (read_ >= 0) ::close(read_);
}

void output_pipe::close_write_end() {
  if (write_ >= 0) ::close(write_);
  write_ = -1;
}

void output_pipe::read_lines(const std::function<void(const std::string&)>& on_line) {
  while (!ended_) read_some(-1, on_line);
}

bool output_pipe::read_lines_until(clock::time_point deadline, const std::function<void(const std::string&)>& on_line) {
  while (!ended_) {
    const auto left = deadline - clock::now();
    if (left <= clock::duration::zero()) return false;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    read_some(static_cast<int>(std::min<std::int64_t>(ms, INT_MAX)), on_line);
  }
  return true;
}

void output_pipe::read_some(int timeout_ms, const std::function<void(const std::string&)>& on_line) {
  pollfd p{read_, POLLIN, 0};
  const int ready = ::poll(&p, 1, timeout_ms);
  if (ready < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  if (ready <= 0) return;
  char buf[4096];
  const ssize_t n = ::read(read_, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    ended_ = true;
    ::close(read_);
    read_ = -1;
    return;
  }
  pending_.append(buf, static_cast<std::size_t>(n));
  for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
    const std::string line = pending_.substr(0, nl);
    pending_.erase(0, nl + 1);
    on_line(line);
  }
}

}  // namespace oobleck::runtime
