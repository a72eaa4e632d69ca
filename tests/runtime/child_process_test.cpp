// Child processes as oobleck-local, the benchmarks and the tests start them: exit statuses, output
// through a pipe and into files, deadlines, and kill-and-reap of a frozen child.
#include "runtime/child_process.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using oobleck::runtime::child_output;
using oobleck::runtime::child_process;
using oobleck::runtime::child_spawn_error;
using oobleck::runtime::output_pipe;
using namespace std::chrono_literals;

namespace {

child_process shell(const std::string& script, const oobleck::runtime::child_streams& streams = {}) {
  return child_process("/bin/sh", {"-c", script}, streams);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string scratch(const std::string& what) {
  return "/tmp/oobleck-child-process-test-" + std::to_string(::getpid()) + "-" + what;
}

/// Whether `pid` is no child of ours any more (reaped).
bool gone(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) < 0 && errno == ECHILD;
}

}  // namespace

TEST_CASE("child_process: the exit code of /bin/sh -c 'exit 3' is 3") {
  auto c = shell("exit 3");
  CHECK(c.wait() == 3);
  CHECK(c.reaped());
  CHECK_FALSE(c.signalled());
  CHECK(c.poll() == 3);  // the status stays known once reaped
}

TEST_CASE("child_process: a child ended by a signal reads 128 + the signal") {
  auto c = shell("kill -TERM $$; sleep 5");
  CHECK(c.wait() == 128 + SIGTERM);
  CHECK(c.signalled());
}

TEST_CASE("child_process: poll says nothing while it runs, then its status") {
  auto c = child_process("/bin/sleep", {"30"});
  CHECK_FALSE(c.poll().has_value());
  CHECK_FALSE(c.reaped());
  c.signal(SIGTERM);
  const auto status = c.wait_until(child_process::clock::now() + 10s);
  REQUIRE(status.has_value());
  CHECK(*status == 128 + SIGTERM);
  CHECK(c.poll() == 128 + SIGTERM);
}

TEST_CASE("child_process: stdin is /dev/null") {
  output_pipe pipe;
  auto c = shell("readlink /proc/$$/fd/0", {.out = child_output::descriptor(pipe.write_end())});
  pipe.close_write_end();
  std::vector<std::string> lines;
  pipe.read_lines([&](const std::string& l) { lines.push_back(l); });
  CHECK(lines == std::vector<std::string>{"/dev/null"});
  CHECK(c.wait() == 0);
}

TEST_CASE("child_process: stdout and stderr through a pipe, line by line") {
  output_pipe pipe;
  auto c = shell("echo one; echo two >&2; printf 'three\\nunfinished'", {.out = child_output::descriptor(pipe.write_end())});
  pipe.close_write_end();
  std::vector<std::string> lines;
  pipe.read_lines([&](const std::string& l) { lines.push_back(l); });
  CHECK(lines == std::vector<std::string>{"one", "two", "three"});  // an unfinished last line is dropped
  CHECK(c.wait() == 0);
}

TEST_CASE("child_process: stdout and stderr into files of their own, or one file for both") {
  const std::string out = scratch("out"), err = scratch("err"), both = scratch("both");
  {
    auto c = shell("echo to-out; echo to-err >&2; exit 2",
                   {.out = child_output::file(out), .err = child_output::file(err)});
    CHECK(c.wait() == 2);
  }
  CHECK(slurp(out) == "to-out\n");
  CHECK(slurp(err) == "to-err\n");
  {
    auto c = shell("echo a; echo b >&2; echo c", {.out = child_output::file(both)});
    CHECK(c.wait() == 0);
  }
  CHECK(slurp(both) == "a\nb\nc\n");
  for (const auto& p : {out, err, both}) std::remove(p.c_str());
}

TEST_CASE("child_process: a deadline that passes while sleep runs gives no status") {
  auto c = child_process("/bin/sleep", {"10"});
  const auto start = child_process::clock::now();
  CHECK_FALSE(c.wait_until(start + 200ms).has_value());
  const auto waited = child_process::clock::now() - start;
  CHECK(waited >= 200ms);
  CHECK(waited < 5s);
  CHECK_FALSE(c.reaped());
  CHECK(c.kill_and_reap() == 128 + SIGKILL);
  CHECK(c.signalled());
}

TEST_CASE("child_process: reading a pipe stops at its deadline and goes on later") {
  output_pipe pipe;
  auto c = shell("echo first; sleep 1; echo second", {.out = child_output::descriptor(pipe.write_end())});
  pipe.close_write_end();
  std::vector<std::string> lines;
  auto collect = [&](const std::string& l) { lines.push_back(l); };
  CHECK_FALSE(pipe.read_lines_until(child_process::clock::now() + 300ms, collect));
  CHECK(lines == std::vector<std::string>{"first"});
  CHECK(pipe.read_lines_until(child_process::clock::now() + 10s, collect));
  CHECK(lines == std::vector<std::string>{"first", "second"});
  CHECK(c.wait() == 0);
}

TEST_CASE("child_process: kill_and_reap ends a SIGSTOPped child") {
  auto c = child_process("/bin/sleep", {"30"});
  c.signal(SIGSTOP);
  const auto by = child_process::clock::now() + 10s;
  while (!c.stopped() && child_process::clock::now() < by) ::usleep(5000);
  REQUIRE(c.stopped());
  const pid_t pid = c.pid();
  const auto start = child_process::clock::now();
  CHECK(c.kill_and_reap() == 128 + SIGKILL);
  CHECK(child_process::clock::now() - start < 5s);
  CHECK(gone(pid));
  CHECK_FALSE(c.stopped());
}

TEST_CASE("child_process: the owner kills and reaps its child when it goes, moved or not") {
  pid_t first = -1, second = -1;
  {
    auto c = child_process("/bin/sleep", {"30"});
    first = c.pid();
    std::vector<child_process> owners;
    owners.push_back(child_process("/bin/sleep", {"30"}));
    second = owners.back().pid();
    owners.back().signal(SIGSTOP);
    auto moved = std::move(c);
    CHECK(moved.pid() == first);
    CHECK(c.reaped());  // the moved-from owner owns nothing
  }
  CHECK(gone(first));
  CHECK(gone(second));
}

TEST_CASE("child_process: a missing program is a clear error") {
  const std::string path = "/nonexistent/oobleck-no-such-program";
  try {
    child_process c(path, {"--flag"});
    FAIL("the spawn of a missing program succeeded");
  } catch (const child_spawn_error& e) {
    CHECK(std::string(e.what()) == "cannot start " + path + ": " + std::strerror(ENOENT));
  }
}

TEST_CASE("child_process: an output file that cannot be created is a clear error") {
  const std::string out = "/nonexistent/oobleck-dir/out.log";
  try {
    auto c = shell("true", {.out = child_output::file(out)});
    FAIL("the spawn with an unwritable output file succeeded");
  } catch (const child_spawn_error& e) {
    CHECK(std::string(e.what()) == "cannot start /bin/sh: " + out + ": " + std::strerror(ENOENT));
  }
}

TEST_CASE("child_process: environment defaults reach the child unless this process has the name") {
  const char* name = "OOBLECK_CHILD_PROCESS_TEST_DEFAULT";
  auto child_sees = [&](const std::vector<std::string>& defaults) {
    output_pipe pipe;
    child_process c("/bin/sh", {"-c", std::string("printf '%s\\n' \"${") + name + "-unset}\""},
                    {.out = child_output::descriptor(pipe.write_end())}, defaults);
    pipe.close_write_end();
    std::vector<std::string> lines;
    pipe.read_lines([&](const std::string& l) { lines.push_back(l); });
    CHECK(c.wait() == 0);
    return lines.size() == 1 ? lines[0] : "(" + std::to_string(lines.size()) + " lines)";
  };
  ::unsetenv(name);
  CHECK(child_sees({}) == "unset");
  CHECK(child_sees({std::string(name) + "=from-default"}) == "from-default");
  CHECK(child_sees({std::string(name) + "="}) == "");  // an empty value is a value
  ::setenv(name, "from-parent", 1);
  CHECK(child_sees({std::string(name) + "=from-default"}) == "from-parent");
  ::unsetenv(name);
  CHECK(child_sees({"OOBLECK_CHILD_PROCESS_TEST_OTHER=x"}) == "unset");  // other names change nothing
  CHECK_THROWS_AS(child_process("/bin/true", {}, {}, {"NO_EQUALS_SIGN"}), std::invalid_argument);
  CHECK_THROWS_AS(child_process("/bin/true", {}, {}, {"=value"}), std::invalid_argument);
}
