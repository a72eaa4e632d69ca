// A node's real stage actor in one process (a one-rank data plane): which layers it keeps across
// epochs (ARCHITECTURE.md §5 "Reconfiguration"). Layers are kept until they are certainly not
// needed: an idle node keeps what it holds until an epoch that does not need it has formed
// everywhere (its first commit, which reaches idle nodes too); until then a plan made again from
// the last formed configuration may ask it for them.

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/stage.hpp"
#include "messages/protocol.hpp"

using namespace oobleck;
using namespace oobleck::messages;

namespace {

actors::stage_job tiny_job() {
  actors::stage_job job;
  job.model.d_model = 16;
  job.model.heads = 2;
  job.model.blocks = 2;
  job.model.seq_len = 8;
  job.global_batch = 4;
  job.microbatch = 2;
  job.train.corpus_bytes = 4096;
  job.data_token = "test token";
  return job;
}

/// Epoch `e` on one node: rank 0 runs every layer (a one-stage pipeline); idle: no rank.
epoch_assignment epoch_of(std::uint64_t e, const actors::stage_job& job, bool idle) {
  epoch_assignment a;
  a.epoch = e;
  a.data_nonce = "nonce-" + std::to_string(e);
  a.peers = {{"127.0.0.1", 0}};
  const int layers = job.model.num_layers();
  for (int l = 0; l < layers; ++l) a.layer_groups.push_back({planning::rank{0}});
  a.pipeline_microbatches = {job.global_batch / job.microbatch};
  if (idle) return a;
  a.rank = planning::rank{0};
  a.stages.push_back({0, 0, 1, planning::layer_index{0}, planning::layer_index{layers}, planning::no_rank,
                      planning::no_rank, 1});
  return a;
}

struct node {
  actors::stage_job job = tiny_job();  // first: the stage is spawned with it
  caf::actor_system_config cfg;
  caf::actor_system sys;
  actors::spawned_stage stage;
  caf::scoped_actor self;

  static caf::actor_system_config& configured(caf::actor_system_config& c) {
    add_protocol_types(c);
    return c;
  }
  node() : sys(configured(cfg)), stage(actors::spawn_stage(sys, job, 1)), self(sys) {}
  ~node() {
    stage.abort(~std::uint64_t{0}, "test over");
    self->send_exit(stage.actor, caf::exit_reason::user_shutdown);
  }

  /// Forms `a`; "" or the stage's error.
  std::string form(const epoch_assignment& a) {
    std::string out = "no reply";
    self->request(stage.actor, std::chrono::seconds(60), a)
        .receive([&](form_timing&) { out.clear(); }, [&](caf::error& e) { out = describe(e); });
    return out;
  }
  std::string commit(std::uint64_t epoch, std::uint64_t step) {
    std::string out = "no reply";
    self->request(stage.actor, std::chrono::seconds(60), commit_step{epoch, step})
        .receive([&](step_committed&) { out.clear(); }, [&](caf::error& e) { out = describe(e); });
    return out;
  }
};

}  // namespace

TEST_CASE("stage layers: an idle node keeps its layers until an epoch that does not need them has formed") {
  node n;
  REQUIRE(n.form(epoch_of(1, n.job, false)) == "");  // built from their seeds
  // Idle in epoch 2, which does not form everywhere (no commit of it): a plan made again from
  // epoch 1's configuration gives the node its layers back without copies (it kept them).
  REQUIRE(n.form(epoch_of(2, n.job, true)) == "");
  CHECK(n.form(epoch_of(3, n.job, false)) == "");
  // Idle in epoch 4, which forms everywhere (its first commit reaches the idle node): the layers
  // are no longer anyone's, and an epoch that would need them without a copy cannot form.
  REQUIRE(n.form(epoch_of(4, n.job, true)) == "");
  REQUIRE(n.commit(4, 0) == "");
  const auto refused = n.form(epoch_of(5, n.job, false));
  CHECK(refused.find("is neither kept nor copied") != std::string::npos);
}
