// The fork server that starts oobleck-local's workers (runtime/fork_server): a copy is the client's
// own child, with its arguments, streams, exit status and command line; a server that cannot serve
// says why; a copy ends with its client when asked.
#include "runtime/fork_server.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/background_process.hpp"

using oobleck::runtime::child_output;
using oobleck::testing::command_line;
using oobleck::runtime::child_process;
using oobleck::runtime::child_spawn_error;
using oobleck::runtime::fork_server;
using oobleck::runtime::output_pipe;
using namespace std::chrono_literals;

namespace {

const std::string probe = OOBLECK_FORK_SERVER_PROBE;

/// What a copy wrote to its stdout and stderr, line by line, once it has ended.
std::vector<std::string> run_to_end(fork_server& server, const std::vector<std::string>& args, int* status) {
  output_pipe pipe;
  auto c = server.start(args, {.out = child_output::descriptor(pipe.write_end())});
  pipe.close_write_end();
  std::vector<std::string> lines;
  REQUIRE(
      pipe.read_lines_until(std::chrono::steady_clock::now() + 20s, [&](const std::string& l) { lines.push_back(l); }));
  *status = c.wait();
  return lines;
}

/// Whether `pid` runs (not a zombie, not gone).
bool running(pid_t pid) {
  const auto s = oobleck::runtime::read_process_status(pid);
  return s && s->state != 'Z';
}

}  // namespace

TEST_CASE("fork_server: a copy runs main on its arguments, writes to its streams and is this process's child") {
  fork_server server(probe, {}, {});
  CHECK(server.pid() > 0);
  int status = -1;
  CHECK(run_to_end(server, {"say", "hello", "world"}, &status) == std::vector<std::string>{"hello world", "to stderr"});
  CHECK(status == 0);
  CHECK(run_to_end(server, {"parent"}, &status) == std::vector<std::string>{std::to_string(::getpid())});
  CHECK(status == 0);
  // Its exit status, and a signal's, read as for a program started with exec.
  auto seven = server.start({"exit", "7"}, {});
  CHECK(seven.wait() == 7);
  CHECK_FALSE(seven.signalled());
  auto paused = server.start({"pause"}, {});
  CHECK_FALSE(paused.wait_until(std::chrono::steady_clock::now() + 100ms));
  paused.signal(SIGKILL);
  CHECK(paused.wait() == 128 + SIGKILL);
  CHECK(paused.signalled());
}

TEST_CASE("fork_server: ps and /proc/PID/cmdline show a copy's own arguments") {
  fork_server server(probe, {}, {});
  auto a = server.start({"pause", "--name", "node7"}, {});
  auto b = server.start({"pause", "--name", "node8"}, {});
  CHECK(command_line(a.pid()) == std::vector<std::string>{probe, "pause", "--name", "node7"});
  CHECK(command_line(b.pid()) == std::vector<std::string>{probe, "pause", "--name", "node8"});
  CHECK(std::filesystem::read_symlink("/proc/" + std::to_string(a.pid()) + "/exe") == std::filesystem::path(probe));
  // Arguments longer than the room the server's command line has are refused, not cut.
  CHECK(server.title_capacity() >= 4096);
  CHECK_THROWS_WITH_AS(server.start({"say", std::string(server.title_capacity(), 'x')}, {}),
                       doctest::Contains("more than the fork server's"), child_spawn_error);
}

TEST_CASE("fork_server: a copy has the server's environment, without the server's own variable") {
  fork_server server(probe, {}, {"PROBE_SETTING=42"});
  int status = -1;
  CHECK(run_to_end(server, {"env", "PROBE_SETTING"}, &status) == std::vector<std::string>{"42"});
  CHECK(run_to_end(server, {"env", oobleck::runtime::fork_server_variable}, &status) ==
        std::vector<std::string>{"(unset)"});
}

TEST_CASE("fork_server: output into a file, both streams appended") {
  const auto file = std::filesystem::temp_directory_path() / ("oobleck-fork-server-" + std::to_string(::getpid()));
  {
    fork_server server(probe, {}, {});
    auto c = server.start({"say", "into", "a", "file"}, {.out = child_output::file(file.string())});
    CHECK(c.wait() == 0);
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == "into a file\nto stderr\n");
  std::filesystem::remove(file);
}

TEST_CASE("fork_server: an output file that cannot be created names itself, and the server serves on") {
  fork_server server(probe, {}, {});
  const std::string out = "/nonexistent/oobleck-dir/out.log";
  try {
    auto c = server.start({"say", "x"}, {.out = child_output::file(out)});
    FAIL("the start with an unwritable output file succeeded");
  } catch (const child_spawn_error& e) {
    CHECK(std::string(e.what()) == "cannot start " + probe + ": " + out + ": " + std::strerror(ENOENT));
  }
  int status = -1;
  CHECK(run_to_end(server, {"say", "still", "here"}, &status) == std::vector<std::string>{"still here", "to stderr"});
  CHECK(status == 0);
}

TEST_CASE("fork_server: a server with a thread started at load refuses, saying why") {
  // A fork keeps only the forking thread: a copy of such a process could wait forever on the
  // threads it does not have (OpenBLAS's pool without OPENBLAS_NUM_THREADS=1).
  CHECK_THROWS_WITH_AS(fork_server(probe, {}, {"PROBE_THREAD_AT_LOAD=1"}),
                       doctest::Contains("runs 2 threads before its main"), child_spawn_error);
}

TEST_CASE("fork_server: a program that is no fork server is refused within the deadline") {
  CHECK_THROWS_WITH_AS(fork_server("/bin/sleep", {}, {}, 300ms),
                       doctest::Contains("cannot start a fork server of /bin/sleep"), child_spawn_error);
  CHECK_THROWS_AS(fork_server("/nonexistent/program", {}, {}), child_spawn_error);
}

TEST_CASE("fork_server: once the server is gone, a start fails with child_spawn_error") {
  fork_server server(probe, {}, {});
  ::kill(server.pid(), SIGKILL);
  CHECK_THROWS_WITH_AS(server.start({"exit", "0"}, {}), doctest::Contains("does not answer"), child_spawn_error);
  CHECK_THROWS_WITH_AS(server.start({"exit", "0"}, {}), doctest::Contains("is gone"), child_spawn_error);
}

TEST_CASE("fork_server: copies outlive the server object, and end with their client when asked") {
  std::optional<child_process> copy;
  {
    fork_server server(probe, {}, {});
    copy = server.start({"pause"}, {});
  }
  CHECK(running(copy->pid()));
  copy->kill_and_reap();

  // A client (the probe) whose server was started with PROBE_EXIT_WITH_CLIENT: killed, its copy ends.
  output_pipe pipe;
  child_process client(probe, {"client"}, {.out = child_output::descriptor(pipe.write_end())},
                       {"PROBE_EXIT_WITH_CLIENT=1"});
  pipe.close_write_end();
  pid_t copy_pid = -1;
  // The client's stdout stays open (it pauses): read until its line has come.
  for (const auto by = std::chrono::steady_clock::now() + 20s; copy_pid < 0 && std::chrono::steady_clock::now() < by;)
    pipe.read_lines_until(std::chrono::steady_clock::now() + 50ms, [&](const std::string& l) {
      if (copy_pid < 0) copy_pid = std::stoi(l);
    });
  REQUIRE(copy_pid > 0);
  CHECK(running(copy_pid));
  client.signal(SIGKILL);
  CHECK(client.wait() == 128 + SIGKILL);
  const auto by = std::chrono::steady_clock::now() + 10s;
  while (running(copy_pid) && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(running(copy_pid));
}

TEST_CASE("fork_server: a program given the server's variable without its socket says so and exits 2") {
  output_pipe pipe;
  child_process c(probe, {"say", "hi"}, {.out = child_output::descriptor(pipe.write_end())},
                  {std::string(oobleck::runtime::fork_server_variable) + "=0"});
  pipe.close_write_end();
  std::vector<std::string> lines;
  pipe.read_lines_until(std::chrono::steady_clock::now() + 20s, [&](const std::string& l) { lines.push_back(l); });
  CHECK(c.wait() == 2);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "error: OOBLECK_FORK_SERVER=0 is set, but descriptor 0 is no fork server's socket (unset it)");
}
