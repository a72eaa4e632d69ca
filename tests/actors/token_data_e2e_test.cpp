// Token files across worker processes (issue 24, item 3): a job whose [data] train is a uint16 token
// file named relative to the job file's folder, run by oobleck-local from another directory, trains
// on that file on every worker (the coordinator sends workers the path made absolute): its loss
// curve equals the single-process run of the same job within 1e-4 relative, and is not the curve of
// the generated corpus.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "apps/stage_job.hpp"
#include "support/apps_dir.hpp"
#include "support/local_run.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;

namespace {

/// `count` uint16 ids in [0, vocab), a repeating pattern with noise: learnable, and far from bytes.
void write_tokens(const std::filesystem::path& path, int count, int vocab) {
  std::mt19937 rng(9);
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const auto id = static_cast<std::uint16_t>((i % 7 == 0 ? rng() : static_cast<unsigned>(i * 37)) % vocab);
    out.put(static_cast<char>(id & 0xff)).put(static_cast<char>(id >> 8));
  }
}

}  // namespace

TEST_CASE("a token file named relative to the job file trains on every worker like the single process") {
  const temp_dir tmp("oobleck-token-data-e2e-");
  std::filesystem::create_directories(tmp.path() / "job" / "data");
  write_tokens(tmp.path() / "job" / "data" / "train.bin", 20'000, 300);
  const auto job_path = (tmp.path() / "job" / "job.toml").string();
  std::ofstream(job_path) << "[model]\nvocab = 300\nd_model = 32\nheads = 2\nblocks = 2\nseq_len = 16\n"
                             "[data]\ntrain = \"data/train.bin\"\n"
                             "[training]\nsteps = 4\nglobal_batch = 8\nmicrobatch = 2\n"
                             "[cluster]\nnodes = 2\nfault_tolerance = 1\n";
  const auto metrics = (tmp.path() / "metrics.jsonl").string();
  // The test's own directory is not the job's: a worker that read "data/train.bin" from its own
  // directory would fail to start.
  REQUIRE(std::filesystem::current_path() != tmp.path() / "job");
  const auto r = run_to_end(bin + "/oobleck-local", {"--config", job_path, "--metrics-out", metrics}, metrics,
                            (tmp.path() / "events.jsonl").string(), std::chrono::seconds(180));
  INFO(r.output);
  REQUIRE(r.status == 0);
  REQUIRE(r.steps.size() == 4);

  const auto job = apps::read_job_file(job_path);
  const auto single = actors::train_single_process(apps::stage_job_for(job), 4);
  auto generated = job;
  generated.data.train.clear();
  const auto other = actors::train_single_process(apps::stage_job_for(generated), 4);
  for (std::size_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    const double loss = r.steps[k].at("loss").get<double>();
    CHECK(std::abs(loss - single[k]) <= 1e-4 * std::abs(single[k]));
    CHECK(std::abs(loss - other[k]) > 1e-3 * std::abs(other[k]));
  }
}
