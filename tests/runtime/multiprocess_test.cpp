// (d) Two heterogeneous pipelines across three processes over the host transport train exactly
// like the same pipelines on threads, and like plain LibTorch.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "support/cluster_harness.hpp"
#include "support/multiprocess_scenario.hpp"

extern char** environ;

using namespace oobleck;

namespace {

/// stage_worker is built beside this test binary.
std::string worker_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  std::string path(self, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + "stage_worker";
}

/// A worker process with its stdin and stdout piped to us.
struct worker {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string buffer;

  worker(int rank, const std::string& result) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    const std::string r = std::to_string(rank), path = worker_path();
    char* argv[] = {const_cast<char*>(path.c_str()), const_cast<char*>(r.c_str()), const_cast<char*>(result.c_str()),
                    nullptr};
    REQUIRE(posix_spawn(&pid, path.c_str(), &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    to = in[1];
    from = out[0];
  }
  ~worker() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(to);
    ::close(from);
  }
  /// The next line, or "" once `deadline` has passed.
  std::string line(std::chrono::steady_clock::time_point deadline) {
    while (buffer.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{from, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      char chunk[256];
      const ssize_t n = ::read(from, chunk, sizeof chunk);
      if (n <= 0) return "";
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
    const auto nl = buffer.find('\n');
    std::string l = buffer.substr(0, nl);
    buffer.erase(0, nl + 1);
    return l;
  }
  void write(const std::string& l) { REQUIRE(::write(to, l.data(), l.size()) == static_cast<ssize_t>(l.size())); }
  /// Its exit code; -1 if it is still running at `deadline` (it is then killed) or was killed.
  int wait(std::chrono::steady_clock::time_point deadline) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
        return -1;
      }
      ::usleep(10'000);
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

}  // namespace

TEST_CASE("(d) heterogeneous pipelines in three processes over the host transport equal the plain loop") {
  const auto s = testing::small_setup();
  const auto sc = testing::multiprocess_scenario();
  const int world = static_cast<int>(sc.ranks.size());
  const std::string base = "/tmp/oobleck-stage-" + std::to_string(::getpid()) + "-";
  std::vector<std::unique_ptr<worker>> workers;
  for (int r = 0; r < world; ++r) workers.push_back(std::make_unique<worker>(r, base + std::to_string(r) + ".pt"));
  // The whole run takes a few seconds; a worker silent past this deadline is stuck (the test
  // fails and kills it rather than waiting on it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::string peers = "peers";
  for (auto& w : workers) {
    const auto l = w->line(deadline);
    REQUIRE_MESSAGE(l.rfind("port ", 0) == 0, "worker did not report its port: '" << l << "'");
    peers += " " + l.substr(5);
  }
  for (auto& w : workers) w->write(peers + "\n");
  for (auto& w : workers) {
    const auto l = w->line(deadline);
    CHECK(l == "done");
    // After "done" it only exits; a worker that never said it is stuck or dead: kill it now.
    CHECK(w->wait(l == "done" ? deadline : std::chrono::steady_clock::now()) == 0);
  }
  // Each layer from its first holder, every holder's copy for the replica check.
  testing::training_result got;
  got.parameters.resize(s.model.num_layers());
  got.digests.resize(s.model.num_layers());
  for (int r = 0; r < world; ++r) {
    std::vector<torch::Tensor> params;
    torch::load(params, base + std::to_string(r) + ".pt");
    std::remove((base + std::to_string(r) + ".pt").c_str());
    const auto& pos = sc.ranks[r].position;
    std::size_t next = 0;
    for (int l = pos.first_layer; l < pos.end_layer; ++l) {
      const auto count = runtime::build_layers(s.model, l, l + 1).front()->parameters().size();
      REQUIRE(next + count <= params.size());
      std::vector<torch::Tensor> layer(params.begin() + next, params.begin() + next + count);
      next += count;
      if (got.parameters[l].empty()) got.parameters[l] = layer;
      got.digests[l].push_back(runtime::tensor_digest(layer));
    }
    CHECK(next == params.size());
  }
  const auto reference = testing::train_reference(s);
  const double diff = testing::max_relative_difference(got, reference);
  MESSAGE("3 processes vs plain loop: max ||p - ref|| / ||ref|| = " << diff);
  CHECK(diff < 1e-5);
  // Replicas agree bitwise across processes, and with the same pipelines run on threads.
  std::vector<testing::pipeline_shape> shapes{{{{0, 6}}, 3}, {{{0, 3}, {3, 6}}, 5}};
  const auto threads = testing::train_pipelines(s, shapes);
  for (int l = 0; l < s.model.num_layers(); ++l) {
    CAPTURE(l);
    for (auto d : got.digests[l]) CHECK(d == threads.digests[l].front());
  }
}
