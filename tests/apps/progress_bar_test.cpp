// oobleck-local's progress bar: its line as formatted, the figures it shows from the commits seen,
// and oobleck-local itself on a pseudo-terminal (the bar drawn in place, below the usual lines)
// and on a plain file (no bar, nothing of it: the output scripts and CI read is unchanged).

#include "apps/progress_bar.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>

#include "apps/local_options.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck::apps;
using namespace std::chrono_literals;

TEST_CASE("progress bar: steps of the total, share, loss, samples/s and ETA in the width given") {
  progress_figures f{12, 20, 3.21449, 412.53, 3.4};
  const std::string line = progress_bar_line(f, 80);
  CHECK(line.size() <= 79);
  CHECK(line.find("12/20  60%") != std::string::npos);
  CHECK(line.find("loss 3.214") != std::string::npos);
  CHECK(line.find("412.5 samples/s") != std::string::npos);
  CHECK(line.find("ETA 0:03") != std::string::npos);
  const auto open = line.find('['), close = line.find(']');
  REQUIRE(open == 0);
  const std::string bar = line.substr(1, close - 1);
  CHECK(bar.size() >= 10);
  CHECK(std::count(bar.begin(), bar.end(), '#') == static_cast<long>(bar.size() * 12 / 20));
  CHECK(bar.find_first_not_of("#-") == std::string::npos);

  // Narrow: the bar goes, the figures stay (cut at the edge at worst); wide: the bar stops at 40.
  CHECK(progress_bar_line(f, 50).find('[') == std::string::npos);
  CHECK(progress_bar_line(f, 50).find("12/20") == 0);
  CHECK(progress_bar_line(f, 20).size() == 19);
  const std::string wide = progress_bar_line(f, 300);
  CHECK(wide.find(']') == 41);

  CHECK(progress_bar_line({20, 20, 1.5, 100.0, 0.0}, 200).find("[########################################] 20/20 100%") == 0);
  CHECK(progress_bar_line({0, 20, 0, std::nullopt, std::nullopt}).find("0/20   0%  ETA --:--") != std::string::npos);
  CHECK(progress_bar_line({0, 20, 0, std::nullopt, std::nullopt}).find("loss") == std::string::npos);
  CHECK(progress_bar_line({3, 20, 1, 1.0, 4000.0}).find("ETA 1:06:40") != std::string::npos);
  // No total (a trace replay): the step and the figures, no bar, no ETA.
  const std::string open_ended = progress_bar_line({7, 0, 2.5, 10.0, std::nullopt});
  CHECK(open_ended.find("step 7") == 0);
  CHECK(open_ended.find("ETA") == std::string::npos);
}

TEST_CASE("progress meter: samples/s and ETA from the last commits' times") {
  progress_meter m(100, 16, 4);
  m.committed(0, 5.0, 1000);
  CHECK(m.figures().done == 1);
  CHECK(!m.figures().samples_per_second);
  CHECK(!m.figures().eta_s);
  m.committed(1, 4.5, 1500);  // 2 steps/s
  CHECK(*m.figures().samples_per_second == doctest::Approx(32));
  CHECK(*m.figures().eta_s == doctest::Approx(98 / 2.0));
  m.committed(2, 4.0, 1600);
  m.committed(3, 3.9, 1700);
  m.committed(4, 3.8, 1800);  // the window: commits 1..4, 3 steps in 300 ms
  CHECK(*m.figures().samples_per_second == doctest::Approx(16 * 10.0));
  CHECK(m.figures().loss == 3.8);
  CHECK(m.figures().done == 5);
  CHECK(*m.figures().eta_s == doctest::Approx(95 / 10.0));
}

TEST_CASE("console: lines above the bar, the bar redrawn below, left on a line of its own at the end") {
  std::ostringstream plain;
  {
    console c(plain, false);
    c.line("one");
    c.bar("[##--] 1/2");
    c.line("two");
  }
  CHECK(plain.str() == "one\ntwo\n");
  std::ostringstream tty;
  {
    console c(tty, true);
    c.line("one");
    c.bar("B1");
    c.bar("B1");  // unchanged: not written again
    c.line("two");
    c.bar("B2");
  }
  CHECK(tty.str() == "one\n\r\033[KB1\r\033[Ktwo\nB1\r\033[KB2\n");
}

namespace {

/// The default job on 2 nodes (one pipeline of two stages), f = 0.
std::string small_job() {
  std::string job = default_local_job;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"nodes = 6", "nodes = 2"},
                                 {"fault_tolerance = 1", "fault_tolerance = 0"}}) {
    const auto at = job.find(from);
    REQUIRE(at != std::string::npos);
    job.replace(at, from.size(), to);
  }
  return job;
}

struct pty_run {
  int status = -1;
  std::string output;
};

/// `program args` on a pseudo-terminal of `columns` columns, its output read until it exits
/// (at most `timeout`, then it is killed).
pty_run run_on_terminal(const std::string& program, const std::vector<std::string>& args, int columns,
                        std::chrono::seconds timeout) {
  winsize size{};
  size.ws_row = 40;
  size.ws_col = static_cast<unsigned short>(columns);
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &size);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::setenv("TERM", "xterm", 1);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  pty_run r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) {
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EIO: every holder of the terminal's other side is gone
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
  return r;
}

}  // namespace

TEST_CASE("oobleck-local: a progress bar on a terminal, the usual lines elsewhere") {
  oobleck::testing::temp_dir dir("oobleck-progress-");
  const auto job = (dir.path() / "job.toml").string();
  std::ofstream(job) << small_job();
  const std::string local = std::string(OOBLECK_APPS_DIR) + "/oobleck-local";
  const std::vector<std::string> args{"--config", job, "--steps", "6", "--timeout", "120"};

  const auto tty = run_on_terminal(local, args, 100, 150s);
  INFO("on the terminal:\n" << tty.output);
  REQUIRE(tty.status == 0);
  std::string text = tty.output;  // the terminal turns "\n" into "\r\n"
  for (std::size_t at; (at = text.find("\r\n")) != std::string::npos;) text.replace(at, 2, "\n");
  CHECK(text.find("\r\033[K[") != std::string::npos);  // the bar, drawn in place
  // Each line as it is left on the screen: what follows the line's last redraw.
  std::vector<std::string> screen;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto redraw = line.rfind("\r\033[K");
    screen.push_back(redraw == std::string::npos ? line : line.substr(redraw + 4));
  }
  REQUIRE(!screen.empty());
  CHECK(screen.back().find("] 6/6 100%") != std::string::npos);  // the last bar stays, on a line of its own
  CHECK(screen.back().find("samples/s") != std::string::npos);
  CHECK(screen.back().find("ETA 0:00") != std::string::npos);
  CHECK(screen.back().size() < 100);
  CHECK(text.back() == '\n');
  for (std::size_t i = 0; i + 1 < screen.size(); ++i) {
    CAPTURE(screen[i]);
    CHECK(screen[i].find("ETA") == std::string::npos);  // no bar left between the lines, none run into one
  }
  // The lines of the coordinator and of the workers came through, above the bar.
  CHECK(std::any_of(screen.begin(), screen.end(), [](auto& l) { return l.find("[coordinator] ") != std::string::npos; }));
  CHECK(std::any_of(screen.begin(), screen.end(), [](auto& l) { return l.find("[worker") != std::string::npos; }));

  const auto plain = oobleck::testing::run_process(local, args);
  INFO("on a file:\n" << plain.out << plain.err);
  REQUIRE(plain.exit_status == 0);
  CHECK(plain.out.find('\r') == std::string::npos);
  CHECK(plain.out.find("\033[") == std::string::npos);
  CHECK(plain.out.find("ETA") == std::string::npos);
  CHECK(plain.out.find("[coordinator] ") != std::string::npos);
}
