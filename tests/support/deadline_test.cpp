// The deadline helper turns a hung task into a failed test, never into a hung test binary.
#include "support/deadline.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>

using namespace oobleck::testing;

namespace {

/// A task that runs until its gate opens.
struct gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::future<int> task() {
    return std::async(std::launch::async, [o = opened] {
      o.wait();
      return 7;
    });
  }
};

/// Runs `body` in a forked child with stdout and stderr captured; waits at most `limit` for it.
struct child_result {
  bool exited = false;  ///< false: still running at the limit (killed)
  int code = -1;
  std::string output;
};

template <class Body>
child_result run_child(Body body, std::chrono::seconds limit) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    body();
    std::fflush(nullptr);
    ::_exit(0);
  }
  ::close(out[1]);
  child_result r;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char chunk[512];
    const ssize_t n = ::read(out[0], chunk, sizeof chunk);
    if (n <= 0) break;  // the child exited (or closed its output)
    r.output.append(chunk, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(out[0]);
      return r;
    }
    ::usleep(10'000);
  }
  ::close(out[0]);
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("tasks that finish in time pass the deadline") {
  std::vector<std::future<int>> tasks;
  for (int i = 0; i < 3; ++i) tasks.push_back(std::async(std::launch::async, [i] { return i; }));
  CHECK_NOTHROW(wait_or_fail(tasks, 10s, "three quick tasks"));
  for (int i = 0; i < 3; ++i) CHECK(tasks[i].get() == i);
}

TEST_CASE("a task past the deadline is released by the caller's release, not waited for") {
  gate g;
  std::vector<std::future<int>> tasks;
  tasks.push_back(g.task());
  std::atomic<bool> released{false};
  const auto outcome = wait_with_deadline(tasks, 200ms, [&] {
    released = true;
    g.open.set_value();
  });
  CHECK(outcome == wait_outcome::released);
  CHECK(released);
  CHECK(tasks[0].get() == 7);
  // As a failure of the test: wait_or_fail throws once the release has freed the task.
  gate h;
  auto task = h.task();
  CHECK_THROWS_WITH_AS(wait_or_fail(task, 200ms, "a stage", [&] { h.open.set_value(); }),
                       doctest::Contains("a stage did not finish within 200 ms (released"), deadline_exceeded);
  CHECK(task.get() == 7);
}

TEST_CASE("a task that nothing releases fails the test and ends the binary instead of hanging it") {
  // The old executor tests did REQUIRE(f.wait_for(deadline) == ready) and then destroyed the
  // std::async future, whose destructor waits for the task forever. Here the child must exit on
  // its own, with the reason, well within the limit.
  const auto r = run_child(
      [] {
        gate g;  // never opened
        auto task = g.task();
        try {
          wait_or_fail(task, 300ms, "a stage that never returns", {}, 300ms);
        } catch (...) {
        }
        std::puts("returned from wait_or_fail");  // must not be reached
      },
      30s);
  INFO("child output:\n" << r.output);
  REQUIRE(r.exited);
  CHECK(r.code == stuck_exit_code);
  CHECK(r.output.find("a stage that never returns did not finish within 300 ms") != std::string::npos);
  CHECK(r.output.find("deadline_test.cpp:") != std::string::npos);  // where the test waited
  CHECK(r.output.find("exiting instead of hanging") != std::string::npos);
  CHECK(r.output.find("returned from wait_or_fail") == std::string::npos);
}
