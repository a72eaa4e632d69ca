// Profile at job start end to end (issue 26, ARCHITECTURE.md §4 "Profile at job start"):
// oobleck-local runs the default job, which has no profile file. One of its workers measures the
// model before the first plan, and the coordinator keeps the profile in the checkpoint folder.
// A second start of the job reads it back, and no node measures the model again.

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/job_file.hpp"
#include "messages/profile_file.hpp"
#include "planning/profile.hpp"
#include "planning/synthetic_profile.hpp"
#include "support/apps_dir.hpp"
#include "support/job_events.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> kept_profiles(const fs::path& folder) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().filename().string().rfind("profile-", 0) == 0) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("profile at job start e2e: a job without a profile is measured on a node, planned from it, and the profile kept for its next start") {
  const temp_dir tmp("oobleck-profile-start-");
  const auto folder = tmp.path() / "ckpt";
  const auto job = apps::parse_job(run_process(bin + "/oobleck-local", {"--print-default-job"}).out, "default job");
  auto run = [&](const std::string& name) {
    const auto metrics = (tmp.path() / (name + ".metrics")).string();
    return run_to_end(bin + "/oobleck-local", {"--steps", "4", "--checkpoint-dir", folder.string(), "--metrics-out", metrics},
                      metrics, (tmp.path() / (name + ".events")).string(), std::chrono::seconds(180));
  };
  const auto first = run("first");
  INFO(first.output);
  REQUIRE(first.status == 0);
  CHECK(contains(first.events, finished(4)));
  const auto kept = kept_profiles(folder);
  REQUIRE(kept.size() == 1u);
  // What this job's model measures on this machine: for its config, microbatch and slots, on the CPU.
  const auto profile = messages::read_profile_file(kept[0].string());
  CHECK_NOTHROW(planning::check_matches(profile, {.microbatch_size = job.training.microbatch,
                                                  .gpus_per_node = job.cluster.slots_per_node,
                                                  .config_hash = job.model.hash(),
                                                  .device_kind = std::string("cpu")}));
  CHECK(profile.num_layers() == job.model.num_layers());
  CHECK(profile.link.latency_ms > 0);  // measured on loopback; the modelled profile has no link
  const auto modelled = planning::synthetic_gpt_profile(apps::synthetic_model(job));
  CHECK(profile.layers[1].forward_ms != modelled.layers[1].forward_ms);
  // What a worker tells its user on purpose: it measured the model (one worker, once).
  std::size_t measured = 0;
  for (auto at = first.output.find("profiling the job's model for the coordinator"); at != std::string::npos;
       at = first.output.find("profiling the job's model for the coordinator", at + 1))
    ++measured;
  CHECK(measured == 1u);

  const auto bytes = read_bytes(kept[0]);
  const auto written = fs::last_write_time(kept[0]);
  const auto second = run("second");
  INFO(second.output);
  REQUIRE(second.status == 0);
  CHECK(contains(second.events, finished(4)));
  CHECK(second.output.find("profiled the job's model") == std::string::npos);  // read back, not measured again
  REQUIRE(kept_profiles(folder).size() == 1u);
  CHECK(read_bytes(kept[0]) == bytes);
  CHECK(fs::last_write_time(kept[0]) == written);
}

TEST_CASE("profile at job start e2e: a kept profile of another model is not used: the job measures its own") {
  const temp_dir tmp("oobleck-profile-stale-");
  const auto job = apps::parse_job(run_process(bin + "/oobleck-local", {"--print-default-job"}).out, "default job");
  // The default job's cache file name, holding a profile of a model one block deeper.
  auto other = job;
  other.model.blocks += 1;
  auto stale = planning::synthetic_gpt_profile(apps::synthetic_model(other));
  stale.config_hash = other.model.hash();
  REQUIRE(stale.config_hash != job.model.hash());
  const auto file = tmp.path() / ("profile-" + job.model.hash() + "-mb" + std::to_string(job.training.microbatch) +
                                  "-slots" + std::to_string(job.cluster.slots_per_node) + "-cpu.json");
  messages::write_profile_json(stale, file.string());
  const auto metrics = (tmp.path() / "metrics").string();
  const auto r = run_to_end(bin + "/oobleck-local", {"--steps", "2", "--checkpoint-dir", tmp.path().string(), "--metrics-out", metrics},
                            metrics, (tmp.path() / "events").string(), std::chrono::seconds(180));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("profiled the job's model") != std::string::npos);
  const auto kept = messages::read_profile_file(file.string());
  CHECK(kept.config_hash == job.model.hash());  // replaced by the measured one
}
