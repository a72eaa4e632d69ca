// GPT-2 (issue 24) across worker processes with oobleck-local: the LM head tied to the token
// embedding on stages of other nodes, a worker killed mid-step, global-norm clipping and evaluation
// rounds, then a resume from a checkpoint on another node count. Every loss equals the single-process
// run of the same job (which adds the tied matrix's two gradients in one store and clips like
// clip_grad_norm_) within 1e-4, both copies of the tied matrix are bitwise equal after every commit,
// and a round's eval loss equals oobleck-eval's on the checkpoint of the same weights.

#include "runtime/corpus.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "runtime/checkpoint.hpp"
#include "support/apps_dir.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using messages::event_kind;
namespace fs = std::filesystem;

namespace {

constexpr int steps = 12;
constexpr int windows = 8;

/// The default job's cluster and sizes (pipelines span nodes: n0 = 2), as GPT-2 with its head tied,
/// clipping at 0.5 and an evaluation round after every 4 steps on `validation`.
std::string job_text(const fs::path& validation) {
  const auto r = run_process(bin + "/oobleck-local", {"--print-default-job"});
  REQUIRE(r.exit_status == 0);
  std::string text = r.out;
  const auto model = text.find("[model]\n");
  REQUIRE(model != std::string::npos);
  text.insert(model + 8, "architecture = \"gpt2\"\n");
  const auto optimizer = text.find("[optimizer]\n");
  REQUIRE(optimizer != std::string::npos);
  text.insert(optimizer + 12, "clip_norm = 0.5\n");
  const auto data = text.find("[data]\n");
  REQUIRE(data != std::string::npos);
  text.insert(data + 7, "validation = \"" + validation.string() + "\"\n");
  text += "\n[eval]\nevery = 4\nwindows = " + std::to_string(windows) + "\n";
  text += "\n[faults]\ndigest_every = 1\n";  // the tied copies compared after every step
  return text;
}

/// Held-out tokens: another generated corpus, as uint16 ids.
void write_validation(const fs::path& path) {
  const auto text = runtime::default_corpus(1 << 14, 4242);
  std::ofstream out(path, std::ios::binary);
  for (unsigned char c : text) {
    const std::uint16_t id = c;
    out.write(reinterpret_cast<const char*>(&id), sizeof id);
  }
}

/// Steps [from, to) of a run: the single-process losses, both tied copies equal, clipping recorded.
void check_steps(const local_run& run, const std::vector<double>& reference, int from, int to) {
  REQUIRE(run.steps.size() == static_cast<std::size_t>(to - from));
  for (int k = from; k < to; ++k) {
    CAPTURE(k);
    const auto& m = run.steps[static_cast<std::size_t>(k - from)];
    CHECK(m["step"] == k);
    const double loss = m["loss"].get<double>();
    const double ref = reference[static_cast<std::size_t>(k)];
    CHECK(std::abs(loss - ref) <= 1e-4 * std::abs(ref));
    REQUIRE(m.contains("tied_digests"));
    const auto& tied = m["tied_digests"];
    // Layer 0 and the last layer, once per pipeline each.
    CHECK(tied.size() == 2 * m["pipelines"].size());
    for (const auto& d : tied) CHECK(d == tied[0]);
    REQUIRE(m.contains("grad_norm"));
    CHECK(m["grad_norm"].get<double>() > 0);
    CHECK(m["grad_scale"].get<double>() <= 1.0);
  }
}

std::vector<nlohmann::json> evals_of(const local_run& run) {
  std::vector<nlohmann::json> out;
  for (const auto& r : run.records)
    if (r["event"] == "eval") out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("gpt2 e2e: a tied head on other nodes, a worker killed, clipping and evaluation: one process's run, then a resume") {
  const temp_dir tmp("oobleck-gpt2-e2e-");
  const auto validation = tmp.path() / "val.bin";
  write_validation(validation);
  const auto job_file = tmp.path() / "gpt2.toml";
  std::ofstream(job_file) << job_text(validation);
  const auto job = apps::read_job_file(job_file.string());
  REQUIRE(runtime::tied(job.model));
  const auto reference = actors::train_single_process(apps::stage_job_for(job), steps);
  // The clip is active: the single process's first norms are above it (else this tests nothing).
  const auto root = tmp.path() / "ckpt";
  const auto metrics = (tmp.path() / "metrics.jsonl").string();
  const auto run = run_to_end(bin + "/oobleck-local",
                              {"--config", job_file.string(), "--nodes", "6", "--steps", std::to_string(steps),
                               "--fail-at", "5:2", "--checkpoint-dir", root.string(), "--checkpoint-every", "4",
                               "--metrics-out", metrics},
                              metrics, (tmp.path() / "events.jsonl").string(), std::chrono::seconds(240));
  const auto events = describe(run.events);
  INFO(run.output);
  INFO(events);
  REQUIRE(run.status == 0);
  CHECK(contains(run.events, {.kind = event_kind::node_lost, .node = 2}));
  check_steps(run, reference, 0, steps);
  // Pipelines of two or more stages: the tied matrix lived on two nodes of one pipeline.
  bool spans = false;
  for (const auto& p : run.steps.front()["pipelines"]) spans = spans || p["nodes"].size() >= 2;
  CHECK(spans);
  CHECK(run.steps.front()["grad_scale"].get<double>() < 1.0);

  // Rounds after steps 3, 7 and 11, each on `windows` windows; the last one's loss is the loss of
  // the weights the final checkpoint holds, as oobleck-eval computes it in one process.
  const auto evals = evals_of(run);
  REQUIRE(evals.size() == 3);
  for (std::size_t i = 0; i < evals.size(); ++i) {
    CHECK(evals[i]["step"] == 4 * i + 3);
    CHECK(evals[i]["windows"] == windows);
  }
  CHECK(evals.back()["loss"].get<double>() < evals.front()["loss"].get<double>());
  const auto last = root / runtime::checkpoint_dir_name(steps);
  REQUIRE(fs::exists(last));
  const auto eval = run_process(bin + "/oobleck-eval", {"--checkpoint", last.string(), "--tokens", validation.string(),
                                                        "--windows", std::to_string(windows), "--json"});
  INFO(eval.out << eval.err);
  REQUIRE(eval.exit_status == 0);
  const auto answer = nlohmann::json::parse(eval.out);
  MESSAGE("rounds: " << evals.front().dump() << " ... " << evals.back().dump() << "; oobleck-eval: " << answer.dump()
                     << "; first step: " << run.steps.front()["grad_norm"] << " scaled by " << run.steps.front()["grad_scale"]);
  CHECK(answer["windows"] == windows);
  CHECK(answer["loss"].get<double>() == doctest::Approx(evals.back()["loss"].get<double>()).epsilon(1e-6));

  // Resume from step 4's checkpoint on 4 nodes: other pipelines, the same trajectory, the copies
  // still equal (a checkpoint carries the matrix once per holder).
  const auto metrics2 = (tmp.path() / "metrics2.jsonl").string();
  const auto resumed = run_to_end(bin + "/oobleck-local",
                                  {"--config", job_file.string(), "--nodes", "4", "--steps", std::to_string(steps),
                                   "--resume", (root / runtime::checkpoint_dir_name(4)).string(), "--metrics-out",
                                   metrics2},
                                  metrics2, (tmp.path() / "events2.jsonl").string(), std::chrono::seconds(240));
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  check_steps(resumed, reference, 4, steps);
  CHECK(evals_of(resumed).size() == 2);  // after steps 7 and 11
}
