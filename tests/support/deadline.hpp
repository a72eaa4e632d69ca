#pragma once
// Waits in tests end at a deadline. A task that is still running then fails the test instead of
// hanging it: the caller's `release` (typically: abort the communicators the task waits on) gets
// a grace period to free it, then the wait throws (a failed test case); if the task still runs
// the test binary exits with a message. Blocking (a std::async future's destructor, a join) would
// hang the suite; detaching is no way out either, because the task uses the test's objects, which
// are about to be destroyed. No doctest here: the stage_worker program uses it too.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::testing {

using namespace std::chrono_literals;

/// What became of a set of tasks waited for with a deadline.
enum class wait_outcome {
  finished,  ///< every task finished before the deadline
  released,  ///< some ran past the deadline; `release` let them finish within the grace period
  stuck,     ///< some still run after release and grace
};

/// Waits for every future until one common deadline, `timeout` from now. Past it, calls `release`
/// (if any) and waits `grace` more. Never blocks longer than timeout + grace, never fails a test.
template <class T>
wait_outcome wait_with_deadline(std::vector<std::future<T>>& futures, std::chrono::milliseconds timeout,
                                const std::function<void()>& release = {}, std::chrono::milliseconds grace = 5s) {
  auto all_ready = [&](std::chrono::steady_clock::time_point until) {
    for (auto& f : futures)
      if (f.valid() && f.wait_until(until) != std::future_status::ready) return false;
    return true;
  };
  if (all_ready(std::chrono::steady_clock::now() + timeout)) return wait_outcome::finished;
  if (release) release();
  return all_ready(std::chrono::steady_clock::now() + grace) ? wait_outcome::released : wait_outcome::stuck;
}

/// Exit code of a test binary that gave up on a stuck task (CTest reports it as a failure).
inline constexpr int stuck_exit_code = 86;

/// A wait ran past its deadline; the tasks were released (their futures are ready).
class deadline_exceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// wait_with_deadline, and a task past the deadline fails the running test: throws
/// deadline_exceeded naming `what` and the place of the wait, once `release` has freed the tasks
/// (their futures are then ready, so dropping them does not block). A task still running after
/// release and grace ends the process with stuck_exit_code and a message on stderr.
template <class T>
void wait_or_fail(std::vector<std::future<T>>& futures, std::chrono::milliseconds timeout, const std::string& what,
                  const std::function<void()>& release = {}, std::chrono::milliseconds grace = 5s,
                  std::source_location where = std::source_location::current()) {
  const auto outcome = wait_with_deadline(futures, timeout, release, grace);
  if (outcome == wait_outcome::finished) return;
  const std::string message = std::string(where.file_name()) + ":" + std::to_string(where.line()) + ": " + what +
                              " did not finish within " + std::to_string(timeout.count()) + " ms";
  if (outcome == wait_outcome::stuck) {
    std::cout.flush();
    std::cerr << message << "\nFATAL: still running " << grace.count()
              << " ms after it was released; exiting instead of hanging" << std::endl;
    std::fflush(nullptr);
    std::_Exit(stuck_exit_code);
  }
  throw deadline_exceeded(message + " (released by aborting what it waited on)");
}

/// One future.
template <class T>
void wait_or_fail(std::future<T>& future, std::chrono::milliseconds timeout, const std::string& what,
                  const std::function<void()>& release = {}, std::chrono::milliseconds grace = 5s,
                  std::source_location where = std::source_location::current()) {
  std::vector<std::future<T>> one;
  one.push_back(std::move(future));
  try {
    wait_or_fail(one, timeout, what, release, grace, where);
  } catch (...) {
    future = std::move(one.front());
    throw;
  }
  future = std::move(one.front());
}

}  // namespace oobleck::testing
