#include "runtime/fork_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <variant>
#include <vector>

namespace oobleck::runtime {

namespace {

// The server's command line: the program, this flag and room for a copy's arguments, which it
// writes over them (what `ps` and /proc/PID/cmdline show of a worker).
constexpr const char* server_flag = "--fork-server";
constexpr std::size_t title_room = 4096;
// A request: a copy's arguments, NUL-terminated; the largest the server takes.
constexpr std::size_t max_request = std::size_t{64} << 10;

/// Sends `bytes` as one message, with `fds` (none or two) attached.
bool send_message(int socket, const std::string& bytes, const int* fds, std::size_t nfds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  while ((n = ::sendmsg(socket, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  return n == static_cast<ssize_t>(bytes.size());
}

/// Waits up to `timeout` for one message; none at the end of the stream, on an error or the timeout
/// (`why` says which).
std::optional<std::string> receive_reply(int socket, std::chrono::milliseconds timeout, std::string& why) {
  pollfd p{socket, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int r = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      why = std::strerror(errno);
      return std::nullopt;
    }
    if (r == 0) {
      why = "no answer within " + std::to_string(timeout.count()) + " ms";
      return std::nullopt;
    }
    break;
  }
  std::string buf(4096, '\0');
  ssize_t n;
  while ((n = ::recv(socket, buf.data(), buf.size(), 0)) < 0 && errno == EINTR) {
  }
  if (n <= 0) {
    why = n == 0 ? "it ended" : std::strerror(errno);
    return std::nullopt;
  }
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

/// The server's own command line, which a copy overwrites with its arguments.
struct title_area {
  char* begin = nullptr;
  std::size_t size = 0;

  title_area(int argc, char** argv) {
    if (argc < 1) return;
    begin = argv[0];
    char* end = argv[0] + std::strlen(argv[0]) + 1;
    for (int i = 1; i < argc && argv[i] == end; ++i) end = argv[i] + std::strlen(argv[i]) + 1;
    size = static_cast<std::size_t>(end - begin);
  }

  void write(const std::string& args) const {
    const std::size_t n = std::min(args.size(), size);
    std::memcpy(begin, args.data(), n);
    std::memset(begin + n, 0, size - n);
  }
};

/// What a server checks before it serves; empty when it may.
std::string reason_not_to_serve(const title_area& title) {
  std::error_code ec;
  const auto tasks = std::distance(std::filesystem::directory_iterator("/proc/self/task", ec), {});
  if (ec) return "cannot count its threads: " + ec.message();
  if (tasks != 1)
    return "it runs " + std::to_string(tasks) +
           " threads before its main (a library started them as it was loaded; OpenBLAS does unless "
           "OPENBLAS_NUM_THREADS=1), and a fork keeps only one of them";
  if (title.size < title_room) return "its command line has room for " + std::to_string(title.size) + " bytes only";
  return {};
}

/// In the copy: shows its arguments as its command line, says its pid, waits until the client has
/// adopted it, takes its streams and runs main. Never returns.
[[noreturn]] void run_copy(int report, int go, int socket, int out, int err, pid_t client, bool exit_with_client,
                           const title_area& title, std::string& request, int (*main_fn)(int, char**)) {
  title.write(request);  // before the client hears of it: what it reads in /proc is already this
  const pid_t said[2] = {::getpid(), 0};
  (void)!::write(report, said, sizeof said);
  ::close(report);
  char byte;
  while (::read(go, &byte, 1) < 0 && errno == EINTR) {
  }
  ::close(go);
  if (exit_with_client) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != client) ::_exit(127);  // the client ended meanwhile (or is no subreaper)
  ::close(socket);
  if (::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(127);
  if (out > 2) ::close(out);
  if (err > 2 && err != out) ::close(err);
  std::vector<char*> argv;
  for (std::size_t at = 0; at < request.size(); at += std::strlen(request.data() + at) + 1)
    argv.push_back(request.data() + at);
  const int argc = static_cast<int>(argv.size());
  argv.push_back(nullptr);
  std::exit(main_fn(argc, argv.data()));
}

/// Starts one copy; its pid, or the reason it could not.
std::variant<pid_t, std::string> start_copy(int socket, int out, int err, pid_t client, bool exit_with_client,
                                            const title_area& title, std::string& request,
                                            int (*main_fn)(int, char**)) {
  int report[2], go[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  if (::pipe2(go, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    return std::string("pipe: ") + std::strerror(e);
  }
  const pid_t middle = ::fork();
  if (middle == 0) {
    // The middle process: forks the copy and ends, which hands the copy to the client. The copy
    // says its pid itself; the middle process only says why there is none.
    ::close(report[0]);
    ::close(go[1]);
    const pid_t copy = ::fork();
    if (copy == 0) run_copy(report[1], go[0], socket, out, err, client, exit_with_client, title, request, main_fn);
    if (copy < 0) {
      const pid_t said[2] = {-1, static_cast<pid_t>(errno)};
      (void)!::write(report[1], said, sizeof said);
    }
    ::_exit(0);
  }
  const int fork_errno = errno;
  ::close(report[1]);
  ::close(go[0]);
  std::variant<pid_t, std::string> result = std::string("fork: ") + std::strerror(fork_errno);
  if (middle > 0) {
    pid_t said[2] = {-1, 0};
    ssize_t n;
    while ((n = ::read(report[0], said, sizeof said)) < 0 && errno == EINTR) {
    }
    int status = 0;
    while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
    }
    // The middle process has ended, so the copy has a new parent by now.
    if (n != static_cast<ssize_t>(sizeof said) || said[0] < 0) {
      result = std::string("fork: ") + std::strerror(n == sizeof said ? static_cast<int>(said[1]) : EIO);
    } else if (const pid_t parent = read_process_status(said[0]).value_or(process_status{}).parent; parent != client) {
      ::kill(said[0], SIGKILL);
      result = "the copy was adopted by process " + std::to_string(parent) + ", not by the client " +
               std::to_string(client) + " (is the client a subreaper?)";
    } else {
      result = said[0];
    }
  }
  ::close(report[0]);
  ::close(go[1]);  // the copy goes on
  return result;
}

}  // namespace

std::optional<int> fork_server_socket() {
  const char* v = std::getenv(fork_server_variable);
  if (v == nullptr) return std::nullopt;
  char* end = nullptr;
  const long fd = std::strtol(v, &end, 10);
  const bool valid = end != v && *end == '\0' && fd >= 0 && fd < 1024;
  ::unsetenv(fork_server_variable);
  if (!valid) return std::nullopt;
  return static_cast<int>(fd);
}

int serve_forks(int socket, int (*main_fn)(int, char**), bool exit_with_client, int argc, char** argv) {
  int type = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(socket, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    std::fprintf(stderr, "error: %s=%d is set, but descriptor %d is no fork server's socket (unset it)\n",
                 fork_server_variable, socket, socket);
    return 2;
  }
  const pid_t client = ::getppid();
  const title_area title(argc, argv);
  if (const std::string why = reason_not_to_serve(title); !why.empty()) {
    send_message(socket, "E" + why, nullptr, 0);
    return 1;
  }
  if (!send_message(socket, "R" + std::to_string(title.size), nullptr, 0)) return 1;
  std::string request(max_request, '\0');
  for (;;) {
    iovec iov{request.data(), request.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? 0 : 1;  // the client closed its end (or is gone)
    int fds[2] = {-1, -1};
    std::size_t nfds = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        std::memcpy(fds, CMSG_DATA(c), std::min<std::size_t>(nfds, 2) * sizeof(int));
      }
    std::string reply;
    std::string args(request.data(), static_cast<std::size_t>(n));
    if (nfds != 2 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || args.empty() || args.back() != '\0') {
      reply = "Ea request of " + std::to_string(n) + " bytes and " + std::to_string(nfds) +
              " descriptors is not arguments and two streams";
    } else if (args.size() > title.size) {
      reply = "Eits arguments take " + std::to_string(args.size()) + " bytes, more than the " +
              std::to_string(title.size) + " a copy's command line has";
    } else {
      const auto r = start_copy(socket, fds[0], fds[1], client, exit_with_client, title, args, main_fn);
      reply =
          std::holds_alternative<pid_t>(r) ? "P" + std::to_string(std::get<pid_t>(r)) : "E" + std::get<std::string>(r);
    }
    for (std::size_t i = 0; i < std::min<std::size_t>(nfds, 2); ++i) ::close(fds[i]);
    if (!send_message(socket, reply, nullptr, 0)) return 1;
  }
}

fork_server::fork_server(const std::string& path, const child_streams& streams,
                         const std::vector<std::string>& env_defaults, std::chrono::milliseconds ready_timeout)
    : path_(path) {
  auto fail = [&](const std::string& why) {
    return child_spawn_error("cannot start a fork server of " + path + ": " + why);
  };
  if (std::getenv(fork_server_variable) != nullptr)
    throw fail(std::string(fork_server_variable) + " is set in this process's environment");
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    throw fail(std::string("PR_SET_CHILD_SUBREAPER: ") + std::strerror(errno));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw fail(std::string("socketpair: ") + std::strerror(errno));
  if (sv[1] == 3) {  // posix_spawn's dup2 onto itself would keep close-on-exec
    const int moved = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
    ::close(sv[1]);
    sv[1] = moved;
  }
  socket_ = sv[0];
  child_streams s = streams;
  s.fd3 = sv[1];
  std::vector<std::string> env = env_defaults;
  env.push_back(std::string(fork_server_variable) + "=3");
  try {
    server_.emplace(path, std::vector<std::string>{server_flag, std::string(title_room, ' ')}, s, env);
  } catch (...) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw;
  }
  ::close(sv[1]);
  std::string why;
  const auto ready = receive_reply(socket_, ready_timeout, why);
  if (!ready || ready->empty() || (*ready)[0] != 'R') {
    server_->kill_and_reap();
    ::close(socket_);
    socket_ = -1;
    throw fail(ready && !ready->empty() && (*ready)[0] == 'E' ? ready->substr(1) : why);
  }
  capacity_ = std::strtoull(ready->c_str() + 1, nullptr, 10);
}

fork_server::~fork_server() {
  if (socket_ >= 0) ::close(socket_);  // the server ends at the end of its stream
  if (server_ && !server_->wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(1)))
    server_->kill_and_reap();
}

child_process fork_server::start(const std::vector<std::string>& args, const child_streams& streams) {
  auto fail = [&](const std::string& why) { return child_spawn_error("cannot start " + path_ + ": " + why); };
  std::string request = path_ + '\0';
  for (const auto& a : args) request += a + '\0';
  if (request.size() > capacity_)
    throw fail("its arguments take " + std::to_string(request.size()) + " bytes, more than the fork server's " +
               std::to_string(capacity_));
  // The streams as descriptors of this process; files opened here are closed once sent.
  std::vector<int> opened;
  auto close_opened = [&] {
    for (int fd : opened) ::close(fd);
  };
  auto descriptor = [&](const child_output& o, int inherited) {
    if (o.fd >= 0) return o.fd;
    if (o.path.empty()) return inherited;
    try {
      opened.push_back(open_child_output(path_, o.path));
    } catch (...) {
      close_opened();
      throw;
    }
    return opened.back();
  };
  const int out = descriptor(streams.out, 1);
  const bool out_redirected = streams.out.fd >= 0 || !streams.out.path.empty();
  const int err = streams.err ? descriptor(*streams.err, 2) : out_redirected ? out : 2;
  const int fds[2] = {out, err};
  std::lock_guard lock(mutex_);
  if (broken_) {
    close_opened();
    throw fail("its fork server is gone");
  }
  const bool sent = send_message(socket_, request, fds, 2);
  std::string why = std::strerror(errno);  // before close() may change errno
  close_opened();
  const auto reply = sent ? receive_reply(socket_, std::chrono::seconds(30), why) : std::nullopt;
  if (!reply || reply->empty() || ((*reply)[0] != 'P' && (*reply)[0] != 'E')) {
    broken_ = true;
    throw fail("its fork server does not answer: " + why);
  }
  if ((*reply)[0] == 'E') throw fail(reply->substr(1));
  return child_process::adopt(static_cast<pid_t>(std::strtol(reply->c_str() + 1, nullptr, 10)));
}

}  // namespace oobleck::runtime
