// The installed CMake package as a user meets it: `cmake --install` of this build into a fresh
// prefix, examples/event_logger configured with find_package(oobleck) against that prefix alone
// and built, then run against a job of the installed programs (a coordinator and two workers
// training three steps). Every step has a deadline.

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "support/background_process.hpp"

using namespace oobleck::testing;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;

/// Runs a program to its end within `timeout`; its exit status, its output in `output`.
int run(const std::string& path, const std::vector<std::string>& args, std::chrono::seconds timeout,
        std::string& output) {
  background_process p(path, args);
  const int status = p.wait_exit(timeout);
  output = p.output();
  return status;
}

struct temp_dir {
  fs::path dir = fs::temp_directory_path() / ("oobleck-package-" + std::to_string(::getpid()));
  temp_dir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~temp_dir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

/// Two nodes, one stage each (the model fits a node): f + 1 = 2 pipelines, three steps.
constexpr const char* tiny_job = R"([model]
vocab = 256
d_model = 32
heads = 2
blocks = 2
seq_len = 16

[data]
corpus_bytes = 65536

[training]
steps = 3
global_batch = 8
microbatch = 2

[cluster]
nodes = 2
fault_tolerance = 1
)";

}  // namespace

TEST_CASE("package: find_package(oobleck) from an install prefix builds an actor that follows a job") {
  temp_dir t;
  const std::string cmake = OOBLECK_CMAKE_COMMAND;
  const std::string prefix = t.path("prefix");
  std::string out;

  REQUIRE_MESSAGE(run(cmake, {"--install", OOBLECK_BUILD_DIR, "--prefix", prefix}, 120s, out) == 0, out);
  for (const char* file : {"lib/cmake/oobleck/oobleckConfig.cmake", "lib/cmake/oobleck/FindCAF.cmake",
                           "include/oobleck/messages/actor_interfaces.hpp", "bin/oobleck-coordinator",
                           "bin/oobleck-worker"})
    CHECK_MESSAGE(fs::exists(fs::path(prefix) / file), file);

  // The example knows nothing of this source tree: only the prefix.
  std::vector<std::string> configure{"-S", std::string(OOBLECK_SOURCE_DIR) + "/examples/event_logger", "-B",
                                     t.path("build"), "-G", OOBLECK_CMAKE_GENERATOR,
                                     "-DCMAKE_PREFIX_PATH=" + prefix,
                                     "-DCMAKE_CXX_COMPILER=" + std::string(OOBLECK_CXX_COMPILER)};
  if (std::string(OOBLECK_MAKE_PROGRAM).size()) configure.push_back("-DCMAKE_MAKE_PROGRAM=" OOBLECK_MAKE_PROGRAM);
  if (std::string(OOBLECK_CXX_LAUNCHER).size())
    configure.push_back("-DCMAKE_CXX_COMPILER_LAUNCHER=" OOBLECK_CXX_LAUNCHER);
  REQUIRE_MESSAGE(run(cmake, configure, 120s, out) == 0, out);
  REQUIRE_MESSAGE(run(cmake, {"--build", t.path("build")}, 240s, out) == 0, out);
  const std::string logger = t.path("build") + "/event_logger";
  REQUIRE(fs::exists(logger));

  // A job of the installed programs, followed from its first admission to its stop.
  std::ofstream(t.path("job.toml")) << tiny_job;
  const std::string bin = prefix + "/bin/";
  background_process coordinator(bin + "oobleck-coordinator",
                                 {"--listen", "127.0.0.1:0", "--config", t.path("job.toml"), "--token-file",
                                  t.path("token"), "--steps", "3", "--nodes", "2", "--address-file", t.path("address")});
  std::string address;
  for (const auto until = std::chrono::steady_clock::now() + 30s; address.empty();) {
    std::ifstream(t.path("address")) >> address;  // written whole (renamed into place) once it listens
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "no address file; output:\n" << coordinator.output());
    std::this_thread::sleep_for(10ms);
  }
  background_process events(logger, {address, t.path("token")});
  // The example's own output is what this test checks: it says when it has subscribed.
  events.wait_for_output("subscribed to " + address);
  std::vector<std::unique_ptr<background_process>> workers;
  for (const char* name : {"w0", "w1"})
    workers.push_back(std::make_unique<background_process>(
        bin + "oobleck-worker", std::vector<std::string>{"--coordinator", address, "--token-file", t.path("token"),
                                                         "--name", name, "--connect-timeout", "20"}));
  CHECK(coordinator.wait_exit(120s) == 0);
  CHECK(events.wait_exit(30s) == 0);
  // Each worker was told, and exits: status 0 is "shut down by the coordinator" (it used to hang in
  // ~actor_system after training now and then).
  for (auto& w : workers) CHECK(w->wait_exit(30s) == 0);

  // What the example printed for its user, one line per event it received.
  const std::string printed = events.output();
  CAPTURE(printed);
  CHECK(printed.find("node joined: 0 w") != std::string::npos);
  CHECK(printed.find("node joined: 1 w") != std::string::npos);
  CHECK(printed.find("epoch formed: 1: ") != std::string::npos);
  for (int step = 0; step < 3; ++step)
    CHECK(printed.find("step committed: " + std::to_string(step) + ", loss ") != std::string::npos);
  CHECK(printed.find("stopped (finished): training finished (epoch 1, 3 step(s) committed)") != std::string::npos);
  CHECK(printed.find("node joined") < printed.find("epoch formed"));
  CHECK(printed.find("epoch formed") < printed.find("step committed: 0"));
  CHECK(printed.find("step committed: 2") < printed.find("stopped ("));
}
