// A node's real stage actor in one process (a one-rank data plane): which layers it keeps across
// epochs (ARCHITECTURE.md §5 "Reconfiguration"). Layers are kept until they are certainly not
// needed: an idle node keeps what it holds until an epoch that does not need it has formed
// everywhere (its first commit, which reaches idle nodes too); until then a plan made again from
// the last formed configuration may ask it for them.

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <utility>
#include <vector>
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
    step_committed ignored;
    return commit(commit_step{epoch, step}, ignored);
  }
  std::string commit(const commit_step& c, step_committed& answer) {
    std::string out = "no reply";
    self->request(stage.actor, std::chrono::seconds(60), c)
        .receive(
            [&](step_committed& a) {
              answer = std::move(a);
              out.clear();
            },
            [&](caf::error& e) { out = describe(e); });
    return out;
  }
  /// Runs `order` on slot 0: "" or the stage's error.
  std::string run(const stage_step& order) {
    std::string out = "no reply";
    self->request(stage.actor, std::chrono::seconds(60), order)
        .receive([&](stage_done& d) { out = d.error; }, [&](caf::error& e) { out = describe(e); });
    return out;
  }
  node_memory memory() {
    node_memory m;
    self->request(stage.actor, std::chrono::seconds(60), memory_atom_v)
        .receive([&](node_memory& r) { m = std::move(r); }, [&](caf::error& e) { FAIL(describe(e)); });
    return m;
  }
};

/// Step `k` of the one-stage epoch `e`: every microbatch of the global batch.
stage_step step_of(std::uint64_t e, std::uint64_t k, const actors::stage_job& job) {
  return stage_step{e, k, 0, job.global_batch / job.microbatch};
}

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

TEST_CASE("stage: a commit that rides with the next step's orders is applied once, where it arrives first") {
  // The coordinator's run-ahead sends step k + 1's orders with the commit of step k: the stage
  // applies the commit before it runs the step, tells its monitor at once, and the monitor's own
  // commit_step (which reaches slot 0 later) finds it applied and answers the same.
  node classic, ahead;
  for (node* n : {&classic, &ahead}) {
    REQUIRE(n->form(epoch_of(1, n->job, false)) == "");
    REQUIRE(n->run(step_of(1, 0, n->job)) == "");
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> told;
  ahead.stage.report_commits_to([&](std::uint64_t e, std::uint64_t k) {
    std::lock_guard lock(mu);
    told.emplace_back(e, k);
    cv.notify_all();
  });
  // The classic order: commit step 0, then run step 1.
  step_committed classic_answer;
  REQUIRE(classic.commit(commit_step{1, 0, 1.0, true}, classic_answer) == "");
  REQUIRE(classic.run(step_of(1, 1, classic.job)) == "");
  // Run-ahead: step 1's orders carry the commit of step 0.
  CHECK(!ahead.stage.applied(1, 0));
  auto order = step_of(1, 1, ahead.job);
  order.commit_first = true;
  order.commit = commit_step{1, 0, 1.0, true, true};
  REQUIRE(ahead.run(order) == "");
  {
    // The digests were asked for: their own thread tells the monitor, once they are ready.
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return !told.empty(); }));
    CHECK(told == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 0}});
  }
  const auto applied = ahead.stage.applied(1, 0);
  REQUIRE(applied);
  CHECK(applied->digests == classic_answer.digests);
  step_committed again;
  REQUIRE(ahead.commit(commit_step{1, 0, 1.0, true, true}, again) == "");
  CHECK(again.digests == classic_answer.digests);
  // Applied once: one AdamW update per layer so far, the same weights as the classic order's.
  for (const auto& l : ahead.memory().layers) CHECK(l.updates == 1);
  REQUIRE(classic.commit(1, 1) == "");
  REQUIRE(ahead.commit(1, 1) == "");
  const auto a = ahead.memory(), c = classic.memory();
  REQUIRE(a.layers.size() == c.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    CHECK(a.layers[i].digest == c.layers[i].digest);
    CHECK(a.layers[i].updates == 2);
  }
  // A late copy of an older commit (slot 0's copy of commit k can wait behind step k + 1 and
  // commit k + 1) changes nothing: it was applied, in order, once. (It was applied again, with
  // step k + 1's gradients, and blocked a 2-slot node whose other stage ran the next step.)
  step_committed late;
  REQUIRE(ahead.commit(commit_step{1, 0, 1.0, true, true}, late) == "");
  CHECK(late.digests.empty());
  const auto after_late = ahead.memory();
  for (std::size_t i = 0; i < after_late.layers.size(); ++i) {
    CHECK(after_late.layers[i].digest == c.layers[i].digest);
    CHECK(after_late.layers[i].updates == 2);
  }
  // Orders that carry another step's commit than their previous one's are refused.
  auto wrong = step_of(1, 3, ahead.job);
  wrong.commit_first = true;
  wrong.commit = commit_step{1, 1};
  CHECK(ahead.run(wrong).find("is not its previous step's") != std::string::npos);
}

TEST_CASE("stage: the digests of a commit that rides with the next step's orders are computed while that step runs") {
  // Hashing every layer is a pass over every parameter: with run-ahead, the stage applies the
  // commit, hands its digests to a thread of their own and runs the next step at once; that
  // thread tells the monitor when they are ready. Here the monitor's side holds that thread: the
  // step still runs to its end, the answer already has the digests, and the next commit, which
  // updates the layers they are computed over, waits for the thread. The digests are the
  // committed step's, as in the classic order (commit, digests, then the next step).
  node classic, ahead;
  for (node* n : {&classic, &ahead}) {
    REQUIRE(n->form(epoch_of(1, n->job, false)) == "");
    REQUIRE(n->run(step_of(1, 0, n->job)) == "");
  }
  step_committed classic_answer;
  REQUIRE(classic.commit(commit_step{1, 0, 1.0, true}, classic_answer) == "");
  REQUIRE(!classic_answer.digests.empty());
  REQUIRE(classic.run(step_of(1, 1, classic.job)) == "");

  std::mutex mu;
  std::condition_variable cv;
  int told = 0;
  bool release = false;
  ahead.stage.report_commits_to([&](std::uint64_t, std::uint64_t) {
    std::unique_lock lock(mu);
    ++told;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(20), [&] { return release; });
  });
  auto order = step_of(1, 1, ahead.job);
  order.commit_first = true;
  order.commit = commit_step{1, 0, 1.0, true, true};
  SUBCASE("the orders apply the commit") {}
  SUBCASE("slot 0's copy of the commit (the monitor's) applies it first") {
    // As on a node of one slot whose monitor's commit_step beats the orders: slot 0 answers at
    // once without the digests, which are still coming (the monitor waits for their nudge).
    step_committed early;
    const auto asked = std::chrono::steady_clock::now();
    REQUIRE(ahead.commit(commit_step{1, 0, 1.0, true, true}, early) == "");
    CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(15));
    CHECK(early.digests.empty());
    CHECK(ahead.stage.digests_coming(1, 0));
  }
  // Had the stage computed the digests (and told the monitor) before the step, it would be held
  // here, and the step would not answer before the 20 s above.
  const auto ran = std::chrono::steady_clock::now();
  REQUIRE(ahead.run(order) == "");
  CHECK(std::chrono::steady_clock::now() - ran < std::chrono::seconds(15));
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return told == 1; }));
  }
  const auto applied = ahead.stage.applied(1, 0);
  REQUIRE(applied);
  CHECK(applied->digests == classic_answer.digests);
  CHECK(!ahead.stage.digests_coming(1, 0));  // handed out
  // The next commit updates the layers: it waits until the digests' thread is done.
  auto next = std::async(std::launch::async, [&] { return ahead.commit(1, 1); });
  CHECK(next.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  {
    std::lock_guard lock(mu);
    release = true;
    cv.notify_all();
  }
  CHECK(next.get() == "");
  REQUIRE(classic.commit(1, 1) == "");
  const auto a = ahead.memory(), c = classic.memory();
  REQUIRE(a.layers.size() == c.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    CHECK(a.layers[i].digest == c.layers[i].digest);
    CHECK(a.layers[i].updates == 2);
  }
}

TEST_CASE("stage layers: an epoch over NCCL is refused by stages on the CPU, saying why, and the next host epoch forms") {
  node n;
  auto nccl = epoch_of(1, n.job, false);
  nccl.nccl_id.assign(128, 7);
  const std::string refused = n.form(nccl);
  CAPTURE(refused);
  CHECK(refused.find("epoch 1 carries tensors over NCCL, but this worker's stages compute on the cpu "
                     "(cluster.data_plane \"nccl\" needs cluster.device \"cuda\")") != std::string::npos);
  CHECK(n.form(epoch_of(2, n.job, false)).empty());
  CHECK(n.run(step_of(2, 0, n.job)).empty());
  CHECK(n.commit(2, 0).empty());
}
