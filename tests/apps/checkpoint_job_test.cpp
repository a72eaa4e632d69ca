#include "apps/checkpoint_job.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <vector>

#include "runtime/checkpoint.hpp"

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
  auto clip = base;
  clip.optimizer.clip_norm = 1.0;
  auto tied = base;
  tied.model.architecture = oobleck::runtime::model_architecture::gpt2;
  for (const auto* j : {&model, &data, &samples, &batch, &lr, &steps, &clip, &tied}) CHECK(trajectory_hash(*j) != hash);
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

namespace {

/// A complete checkpoint of `job` at `step` under `root`, its layer files of made-up bytes (what
/// validation checks is the manifest's sizes and checksums, not the contents).
std::string write_checkpoint_of(const job_file& job, const std::string& root, std::uint64_t step) {
  auto deps = checkpoint_deps_for(job, root, 0);
  const auto temp = deps.begin(step);
  std::vector<oobleck::messages::checkpoint_layer_file> files;
  for (int l = 0; l < job.model.num_layers(); ++l) {
    std::vector<std::byte> bytes(16 + static_cast<std::size_t>(l), std::byte{static_cast<unsigned char>(step)});
    const auto f = oobleck::runtime::write_layer_file(temp, l, bytes);
    files.push_back({oobleck::planning::layer_index{l}, f.bytes, f.sha256});
  }
  return deps.finish(temp, step, files);
}

}  // namespace

TEST_CASE("checkpoint job: --resume takes a step-N folder, or the checkpoint folder and then its newest valid checkpoint") {
  const job_file job = parse_job("", "job");
  const auto root = std::filesystem::temp_directory_path() / ("oobleck-resume-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  const auto at4 = write_checkpoint_of(job, root.string(), 4);
  const auto at8 = write_checkpoint_of(job, root.string(), 8);

  oobleck::actors::checkpoint_deps deps;
  CHECK(resume_from(deps, job, at4).empty());  // a checkpoint itself: taken as it is, nothing to say
  CHECK(deps.resume_step == 4);
  CHECK(deps.resume_dir == at4);

  const auto said = resume_from(deps, job, root.string());  // the folder a user naturally passes
  CHECK(deps.resume_step == 8);
  CHECK(deps.resume_dir == at8);
  CHECK(said.find(at8) != std::string::npos);  // the line names what was chosen

  // A newest checkpoint that does not validate (a layer file gone) is passed over, and said so.
  std::filesystem::remove(std::filesystem::path(at8) / oobleck::runtime::layer_file_name(0));
  const auto fallback = resume_from(deps, job, root.string());
  CHECK(deps.resume_step == 4);
  CHECK(fallback.find("step-00000008") != std::string::npos);

  // Another job's checkpoints only: refused, naming the folder; a folder with none: refused too.
  auto other = job;
  other.model.seed += 1;
  CHECK_THROWS_AS(resume_from(deps, other, root.string()), oobleck::runtime::checkpoint_error);
  const auto empty = root / "nothing-here";
  std::filesystem::create_directories(empty);
  CHECK_THROWS_AS(resume_from(deps, job, empty.string()), oobleck::runtime::checkpoint_error);
  std::filesystem::remove_all(root);
}
