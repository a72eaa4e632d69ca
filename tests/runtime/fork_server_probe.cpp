// A program for the fork server's tests: run as a fork server when OOBLECK_FORK_SERVER says so
// (as oobleck-worker is), else it does what its first argument says:
//   say WORDS...   WORDS to stdout, "to stderr" to stderr; exit 0
//   exit N         exit N
//   parent         its parent's pid to stdout
//   env NAME       NAME's value (or "(unset)") to stdout
//   pause          waits for a signal
//   client         starts a fork server of itself and one copy that pauses, says the copy's pid, pauses
// With PROBE_THREAD_AT_LOAD in its environment, a thread starts before main (as OpenBLAS starts its
// pool at load), and with PROBE_EXIT_WITH_CLIENT its copies end with the client.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "runtime/fork_server.hpp"

namespace {

const bool thread_at_load = [] {
  if (std::getenv("PROBE_THREAD_AT_LOAD") == nullptr) return false;
  std::thread([] { std::this_thread::sleep_for(std::chrono::hours(1)); }).detach();
  return true;
}();

int probe(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "say") {
    for (int i = 2; i < argc; ++i) std::cout << (i > 2 ? " " : "") << argv[i];
    std::cout << std::endl;
    std::cerr << "to stderr" << std::endl;
    return 0;
  }
  if (what == "exit" && argc > 2) return std::atoi(argv[2]);
  if (what == "parent") {
    std::cout << ::getppid() << std::endl;
    return 0;
  }
  if (what == "env" && argc > 2) {
    const char* v = std::getenv(argv[2]);
    std::cout << (v ? v : "(unset)") << std::endl;
    return 0;
  }
  if (what == "pause") {
    for (;;) ::pause();
  }
  if (what == "client") {
    char self[4096] = {};
    if (::readlink("/proc/self/exe", self, sizeof self - 1) < 0) return 1;
    oobleck::runtime::fork_server server(self, {}, {});
    auto copy = server.start({"pause"}, {});
    std::cout << copy.pid() << std::endl;
    for (;;) ::pause();
  }
  std::cerr << "fork_server_probe: unknown command '" << what << "'" << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (const auto socket = oobleck::runtime::fork_server_socket())
    return oobleck::runtime::serve_forks(*socket, probe, std::getenv("PROBE_EXIT_WITH_CLIENT") != nullptr, argc, argv);
  return probe(argc, argv);
}
