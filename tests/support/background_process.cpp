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

std::string background_process::wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
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

char process_state(pid_t pid) {
  const auto s = runtime::read_process_status(pid);
  return s ? s->state : 0;
}

std::set<std::uint16_t> listening_ports(pid_t pid) {
  const auto proc = std::filesystem::path("/proc") / std::to_string(pid);
  std::set<std::string> inodes;  // of its sockets: fd links read "socket:[INODE]"
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(proc / "fd", ec)) {
    const auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<std::uint16_t> ports;
  for (const char* table : {"net/tcp", "net/tcp6"}) {
    std::ifstream in(proc / table);
    std::string line;
    std::getline(in, line);  // the header
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retransmits, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retransmits >> uid >> timeout >> inode)) continue;
      if (st != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      ports.insert(static_cast<std::uint16_t>(std::stoul(local.substr(local.rfind(':') + 1), nullptr, 16)));
    }
  }
  return ports;
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto child = static_cast<pid_t>(std::stoi(pid));
    if (const auto s = runtime::read_process_status(child); s && s->parent == parent) children.push_back(child);
  }
  return children;
}

std::vector<std::string> command_line(pid_t pid) {
  std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string a; std::getline(cmd, a, '\0');)
    if (!a.empty()) argv.push_back(a);
  return argv;
}

pid_t child_named(pid_t parent, const std::string& name) {
  for (const pid_t child : children_of(parent)) {
    const auto argv = command_line(child);
    for (std::size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == "--name" && argv[i + 1] == name) return child;
  }
  return -1;
}

}  // namespace oobleck::testing
