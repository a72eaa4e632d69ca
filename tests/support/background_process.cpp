#include "support/background_process.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace oobleck::testing {

namespace {
std::atomic<int> counter{0};

std::string next_log_path() {
  return "/tmp/oobleck-bg-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log";
}
}  // namespace

background_process::background_process(const std::string& path, const std::vector<std::string>& args)
    : log_path_(next_log_path()), child_(path, args, {.out = runtime::child_output::file(log_path_)}) {}

background_process::~background_process() {
  child_.kill_and_reap();
  ::unlink(log_path_.c_str());
}

std::string background_process::output() const {
  std::ifstream in(log_path_, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string background_process::wait_for_line(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::istringstream lines(output());
    for (std::string line; std::getline(lines, line);)
      if (line.find(text) != std::string::npos) return line;
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("no line with '" + text + "' within " +
                               std::to_string(timeout.count()) + " ms; output:\n" + output());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int background_process::wait_exit(std::chrono::milliseconds timeout) {
  const auto status = child_.wait_until(std::chrono::steady_clock::now() + timeout);
  if (!status)
    throw std::runtime_error("the process did not exit within " + std::to_string(timeout.count()) +
                             " ms; output:\n" + output());
  return *status;
}

void background_process::signal(int sig) { child_.signal(sig); }

pid_t child_named(pid_t parent, const std::string& name) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string statline;
    std::getline(stat, statline);
    const auto close = statline.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(statline.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
    std::vector<std::string> argv;
    for (std::string a; std::getline(cmd, a, '\0');) argv.push_back(a);
    for (std::size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == "--name" && argv[i + 1] == name) return static_cast<pid_t>(std::stoi(pid));
  }
  return -1;
}

}  // namespace oobleck::testing
