#include "apps/checkpoint_job.hpp"

#include <doctest/doctest.h>

#include <filesystem>

using namespace oobleck::apps;

TEST_CASE("checkpoint job: the trajectory hash covers what decides the trajectory, and nothing else") {
  const job_file base = parse_job("", "job");
  const auto hash = trajectory_hash(base);
  CHECK(hash.size() == 64);
  // What may change between the run that checkpointed and the one that resumes.
  auto other = base;
  other.cluster.nodes = 4;
  other.cluster.fault_tolerance = 2;
  other.cluster.device_memory_bytes = 1'000'000;
  other.checkpoint.dir = "/elsewhere";
  other.checkpoint.every = 3;
  other.http.port = 8080;
  other.profile.file = "p.json";
  CHECK(trajectory_hash(other) == hash);
  // What may not.
  auto model = base;
  model.model.seed += 1;
  auto data = base;
  data.data.corpus_seed += 1;
  auto samples = base;
  samples.training.seed += 1;
  auto batch = base;
  batch.training.global_batch *= 2;
  auto lr = base;
  lr.optimizer.lr.peak *= 1.0000001;
  auto steps = base;
  steps.training.steps += 1;  // the LR schedule ends there
  for (const auto* j : {&model, &data, &samples, &batch, &lr, &steps}) CHECK(trajectory_hash(*j) != hash);
}

TEST_CASE("checkpoint job: the printed resume commands") {
  CHECK(resume_command_line("oobleck-coordinator", {"--listen", "0.0.0.0:7000", "--resume", "/a/step-1", "--steps", "9"},
                            "/ck/step-00000004") ==
        "oobleck-coordinator --listen 0.0.0.0:7000 --steps 9 --resume /ck/step-00000004");
  CHECK(resume_command_line("x", {}, "/with space/it's") == "x --resume '/with space/it'\\''s'");
  const auto cwd = std::filesystem::current_path().string();
  CHECK(local_resume_prefix({"--steps", "8", "--fail-at", "3:0,1", "--hang-at=4:2", "--checkpoint-dir", "ck",
                             "--resume", "old", "--join-at", "2:1", "--nodes", "6"}) ==
        "oobleck-local --steps 8 --checkpoint-dir " + cwd + "/ck --nodes 6");
}
