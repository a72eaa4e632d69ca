#include "bench/single_process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <thread>

#include "actors/stage.hpp"
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "bench/cluster_programs.hpp"
#include "runtime/child_process.hpp"

namespace oobleck::bench {

double single_process_step_ms(const actors::stage_job& job, int warmup, int steps) {
  auto timed = [&](int n) {
    const auto t0 = std::chrono::steady_clock::now();
    actors::train_single_process(job, static_cast<std::uint64_t>(n));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const double with = timed(warmup + steps);
  const double without = timed(warmup);
  return (with - without) / steps;
}

int side_by_side_child(const std::vector<std::string>& words) {
  const auto job = apps::stage_job_for(apps::read_job_file(words.at(0)));
  const int warmup = std::stoi(words.at(1)), steps = std::stoi(words.at(2));
  actors::train_single_process(job, static_cast<std::uint64_t>(warmup));
  std::printf("ready\n");
  std::fflush(stdout);
  char byte;
  while (::read(3, &byte, 1) > 0) {
  }
  std::printf("step_ms %.9g\n", single_process_step_ms(job, warmup, steps));
  return 0;
}

std::vector<double> side_by_side_step_ms(const std::filesystem::path& dir, const std::filesystem::path& job, int copies, int warmup, int steps) {
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  struct fds {
    int* go;
    ~fds() {
      if (go[0] >= 0) ::close(go[0]);
      if (go[1] >= 0) ::close(go[1]);
    }
  } const closer{go};
  const std::string self = runtime::this_program_path();
  std::vector<runtime::child_process> children;
  std::vector<std::filesystem::path> logs;
  for (int i = 0; i < copies; ++i) {
    logs.push_back(dir / ("side-by-side-" + std::to_string(i) + ".log"));
    children.emplace_back(self,
                          std::vector<std::string>{"--side-by-side-child", job.string(), std::to_string(warmup),
                                                   std::to_string(steps)},
                          runtime::child_streams{runtime::child_output::file(logs.back().string()), std::nullopt, go[0]});
  }
  ::close(go[0]);
  go[0] = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  auto failed = [&](std::size_t i, const std::string& what) {
    return std::runtime_error("a side-by-side single process " + what + ":\n" + read_text(logs[i]));
  };
  for (std::size_t i = 0; i < children.size(); ++i)
    while (read_text(logs[i]).find("ready\n") == std::string::npos) {
      if (children[i].poll()) throw failed(i, "ended before it was ready");
      if (std::chrono::steady_clock::now() > deadline) throw failed(i, "was not ready within 5 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  ::close(go[1]);  // every copy starts its timed steps now
  go[1] = -1;
  std::vector<double> ms;
  for (std::size_t i = 0; i < children.size(); ++i) {
    const auto status = children[i].wait_until(deadline);
    if (!status || *status != 0) throw failed(i, status ? "failed (" + std::to_string(*status) + ")" : "ran past 5 minutes");
    const auto text = read_text(logs[i]);
    const auto at = text.find("step_ms ");
    if (at == std::string::npos) throw failed(i, "printed no step time");
    ms.push_back(std::stod(text.substr(at + 8)));
  }
  return ms;
}

}  // namespace oobleck::bench
