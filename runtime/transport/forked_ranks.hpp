#pragma once
// Ranks of the host transport as real processes, for the tests and benchmarks that kill
// (SIGKILL) and freeze (SIGSTOP) them: tests/runtime/transport_process_test.cpp,
// tests/runtime/fake_vs_processes_test.cpp, bench/transport_failure_latency.cpp. The parent
// forks every child before any transport (hence any thread) exists; each child talks to the
// parent through two pipes, one text line at a time, and ends with _exit, so that nothing of the
// parent's (a test framework's runner, a benchmark's report) runs twice. No test framework here.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <memory>
#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime::forked_ranks {

/// The child's end: blocking line I/O with the parent process.
class parent_line {
 public:
  parent_line(int in, int out) : in_(in), out_(out) {}
  void send(const std::string& line) {
    const std::string framed = line + "\n";
    std::size_t done = 0;
    while (done < framed.size()) {
      const ssize_t n = ::write(out_, framed.data() + done, framed.size() - done);
      if (n <= 0) throw std::runtime_error("child: the parent process went away");
      done += static_cast<std::size_t>(n);
    }
  }
  std::string read() {
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      char chunk[256];
      const ssize_t n = ::read(in_, chunk, sizeof chunk);
      if (n <= 0) throw std::runtime_error("child: the parent process went away");
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

 private:
  int in_, out_;
  std::string buffer_;
};

/// The parent's end: `n` forked children running body(rank, line).
class process_group {
 public:
  process_group(int n, const std::function<void(int, parent_line&)>& body) {
    std::vector<std::array<int, 2>> down(static_cast<std::size_t>(n)),
        up(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      if (::pipe(down[static_cast<std::size_t>(r)].data()) != 0 ||
          ::pipe(up[static_cast<std::size_t>(r)].data()) != 0)
        throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    for (int r = 0; r < n; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        // Keep only this child's ends; the children forked before already lost theirs here.
        for (int o = 0; o < n; ++o) {
          auto& d = down[static_cast<std::size_t>(o)];
          auto& u = up[static_cast<std::size_t>(o)];
          ::close(d[1]);
          ::close(u[0]);
          if (o > r) {
            ::close(d[0]);
            ::close(u[1]);
          }
        }
        parent_line line(down[static_cast<std::size_t>(r)][0], up[static_cast<std::size_t>(r)][1]);
        int code = 0;
        try {
          body(r, line);
        } catch (const std::exception& e) {
          try {
            line.send(std::string("error ") + e.what());
          } catch (...) {
          }
          code = 1;
        }
        ::_exit(code);
      }
      children_.push_back(
          {pid, down[static_cast<std::size_t>(r)][1], up[static_cast<std::size_t>(r)][0], {}});
      ::close(down[static_cast<std::size_t>(r)][0]);
      ::close(up[static_cast<std::size_t>(r)][1]);
    }
  }

  ~process_group() {
    for (auto& c : children_) {
      if (c.pid > 0) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
      }
      ::close(c.to);
      ::close(c.from);
    }
  }
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  void send(int rank, const std::string& line) {
    const std::string framed = line + "\n";
    if (::write(at(rank).to, framed.data(), framed.size()) != static_cast<ssize_t>(framed.size()))
      throw std::runtime_error("cannot write to rank " + std::to_string(rank));
  }

  /// The next line from `rank`; a line "error ..." (the child threw) or silence is an error.
  std::string read(int rank, std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto& c = at(rank);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = c.buffer.find('\n'); nl != std::string::npos) {
        std::string line = c.buffer.substr(0, nl);
        c.buffer.erase(0, nl + 1);
        if (line.rfind("error ", 0) == 0)
          throw std::runtime_error("rank " + std::to_string(rank) + " failed: " + line.substr(6));
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{c.from, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("rank " + std::to_string(rank) + " said nothing for " +
                                 std::to_string(timeout.count()) + " ms");
      char chunk[256];
      const ssize_t n = ::read(c.from, chunk, sizeof chunk);
      if (n <= 0) throw std::runtime_error("rank " + std::to_string(rank) + " exited early");
      c.buffer.append(chunk, static_cast<std::size_t>(n));
    }
  }

  void signal(int rank, int sig) { ::kill(at(rank).pid, sig); }

  /// Waits for `rank` to end; returns its exit code, or 128 + signal. A rank still running
  /// after `timeout` is killed and the call throws: the caller fails instead of hanging.
  int wait(int rank, std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto& c = at(rank);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      const pid_t done = ::waitpid(c.pid, &status, WNOHANG);
      if (done == c.pid) break;
      if (done < 0) throw std::runtime_error("waitpid failed for rank " + std::to_string(rank));
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        c.pid = -1;
        throw std::runtime_error("rank " + std::to_string(rank) + " did not exit within " +
                                 std::to_string(timeout.count()) + " ms (killed)");
      }
      ::usleep(1000);
    }
    c.pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  /// Port exchange for a new epoch: each of `ranks` (in new-rank order) reports "port P" and
  /// gets back "peers P0 P1 ...".
  void exchange_ports(const std::vector<int>& ranks) {
    std::ostringstream peers;
    peers << "peers";
    for (int r : ranks) {
      const std::string line = read(r);
      if (line.rfind("port ", 0) != 0) throw std::runtime_error("expected a port, got: " + line);
      peers << ' ' << line.substr(5);
    }
    for (int r : ranks) send(r, peers.str());
  }

 private:
  struct child {
    pid_t pid;
    int to, from;
    std::string buffer;
  };
  child& at(int rank) { return children_.at(static_cast<std::size_t>(rank)); }
  std::vector<child> children_;
};

/// Child side of exchange_ports: listen on a free port, report it, connect to the peers given,
/// proving `key` (the same for every rank, as a job's token is) over a nonce of the epoch.
inline std::unique_ptr<host_transport> join_mesh(parent_line& line, int rank, int world,
                                                 std::uint64_t epoch,
                                                 const std::string& key = "forked-ranks-token") {
  transport_config c{.rank = rank,
                     .peers = std::vector<peer_endpoint>(static_cast<std::size_t>(world)),
                     .epoch = epoch,
                     .connect_timeout = std::chrono::seconds(10),
                     .auth_key = key,
                     .auth_nonce = "nonce-of-epoch-" + std::to_string(epoch)};
  auto t = std::make_unique<host_transport>(c);
  line.send("port " + std::to_string(t->listen_port()));
  std::istringstream in(line.read());
  std::string word;
  in >> word;
  for (auto& p : c.peers) in >> p.port;
  t->connect(c.peers);
  return t;
}

}  // namespace oobleck::runtime::forked_ranks
