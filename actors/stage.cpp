#include "actors/stage.hpp"

#include <torch/torch.h>

#include <mutex>

#include <caf/stateful_actor.hpp>

#include "runtime/dataset.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stage_executor.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// The stage's data plane and executor for one epoch. The transport may be aborted from another
/// thread; everything else is touched by the stage's own thread only.
struct stage_runtime {
  explicit stage_runtime(stage_job j)
      : job(std::move(j)),
        data(runtime::default_corpus(static_cast<std::size_t>(job.corpus_bytes), job.corpus_seed), job.model.seq_len),
        samples(job.sample_seed, data.size(), job.global_batch) {}

  stage_job job;
  runtime::token_dataset data;
  runtime::sampler samples;
  epoch_assignment assignment;
  std::mutex abort_mu;  // guards `transport` for abort() from the monitor's thread
  std::unique_ptr<runtime::host_transport> transport;
  bool aborted = false;
  std::string abort_reason;
  std::unique_ptr<runtime::host_communicator> comm;
  std::unique_ptr<runtime::stage_executor> executor;
  std::vector<std::vector<int>> layer_groups;

  void abort(const std::string& reason) {
    std::lock_guard lock(abort_mu);
    aborted = true;
    abort_reason = reason;
    if (transport) transport->abort(reason);
  }
};

/// Executor options of a job (the same for every stage and for the single-process run).
runtime::executor_options options_of(const stage_job& job) {
  runtime::executor_options opt;
  opt.microbatch_size = job.microbatch;
  opt.global_microbatches = job.global_batch / job.microbatch;
  opt.optimizer = job.optimizer;
  return opt;
}

/// A communicator for one rank alone: a single stage over all layers never communicates.
class solo_communicator final : public runtime::communicator {
 public:
  int rank() const override { return 0; }
  void send(const torch::Tensor&, int, int) override { fail(); }
  void recv(torch::Tensor&, int, int) override { fail(); }
  void all_reduce_sum(torch::Tensor&, const std::vector<int>&) override {}
  void broadcast(torch::Tensor&, int, const std::vector<int>&) override {}
  void abort() override {}

 private:
  [[noreturn]] static void fail() { throw runtime::comm_error("a single-process run has no peers"); }
};

struct stage_state {
  std::shared_ptr<stage_runtime> rt;
  static inline const char* name = "oobleck.stage";
};

using stage_pointer = stage_actor::stateful_pointer<stage_state>;

bool form(stage_runtime& rt, const epoch_assignment& a) {
  if (a.rank < 0 || a.rank >= static_cast<std::int32_t>(a.peers.size()) || a.stages.size() != 1)
    throw std::invalid_argument("a stage needs a rank among the peers and exactly one stage");
  rt.assignment = a;
  runtime::transport_config cfg;
  cfg.rank = a.rank;
  cfg.epoch = a.epoch;
  cfg.connect_timeout = std::chrono::milliseconds(rt.job.connect_timeout_ms);
  for (const auto& p : a.peers) cfg.peers.push_back({p.host, p.port});
  {
    std::lock_guard lock(rt.abort_mu);
    if (rt.aborted) throw std::runtime_error("aborted before forming: " + rt.abort_reason);
    rt.transport = std::make_unique<runtime::host_transport>(cfg);
  }
  rt.transport->connect();
  rt.comm = std::make_unique<runtime::host_communicator>(*rt.transport);
  const auto& s = a.stages[0];
  runtime::stage_position pos{s.first_layer, s.end_layer, s.stage, s.num_stages, s.prev_rank, s.next_rank};
  rt.executor = std::make_unique<runtime::stage_executor>(rt.job.model, pos, *rt.comm, options_of(rt.job));
  rt.layer_groups.clear();
  for (const auto& g : a.layer_groups) rt.layer_groups.emplace_back(g.begin(), g.end());
  return true;
}

stage_done run(stage_runtime& rt, const stage_step& order) {
  const auto& s = rt.assignment.stages.at(0);
  stage_done done{order.epoch, order.step, s.pipeline, s.stage, 0, {}};
  try {
    const auto all = rt.samples.step_samples(static_cast<std::int64_t>(order.step));
    const auto b = static_cast<std::size_t>(rt.job.microbatch);
    const std::vector<std::int64_t> ids(all.begin() + static_cast<std::ptrdiff_t>(order.first_microbatch * b),
                                        all.begin() + static_cast<std::ptrdiff_t>((order.first_microbatch + order.microbatches) * b));
    const auto [inputs, targets] = rt.data.batch(ids);
    done.loss_sum = rt.executor->run_step(order.microbatches, inputs, targets);
    rt.executor->reduce_gradients(rt.layer_groups);
  } catch (const std::exception& e) {
    rt.executor->discard();
    done.error = e.what();
  }
  return done;
}

stage_actor::behavior_type stage_behavior(stage_pointer self, std::shared_ptr<stage_runtime> rt) {
  self->state.rt = std::move(rt);
  return {
      [self](epoch_assignment& a) -> caf::result<bool> {
        try {
          return form(*self->state.rt, a);
        } catch (const std::exception& e) {
          return make_error(protocol_error::bad_request, std::string("forming the stage: ") + e.what());
        }
      },
      [self](stage_step& order) -> stage_done {
        auto& rt = *self->state.rt;
        if (!rt.executor || order.epoch != rt.assignment.epoch)
          return {order.epoch, order.step, -1, -1, 0, "the stage is not formed for epoch " + std::to_string(order.epoch)};
        return run(rt, order);
      },
      [self](commit_step& c) -> step_committed {
        auto& rt = *self->state.rt;
        step_committed out{c.epoch, c.step, -1, {}};
        if (!rt.executor) return out;
        rt.executor->commit();
        const auto& s = rt.assignment.stages.at(0);
        for (int l = s.first_layer; l < s.end_layer; ++l)
          out.digests.push_back({l, rt.executor->parameter_digest(l)});
        return out;
      },
  };
}

}  // namespace

std::vector<double> train_single_process(const stage_job& job, std::uint64_t steps) {
  torch::set_num_threads(1);
  const runtime::token_dataset data(runtime::default_corpus(static_cast<std::size_t>(job.corpus_bytes), job.corpus_seed),
                                    job.model.seq_len);
  const runtime::sampler samples(job.sample_seed, data.size(), job.global_batch);
  solo_communicator comm;
  const int layers = job.model.num_layers();
  runtime::stage_executor executor(job.model, {0, layers, 0, 1, -1, -1}, comm, options_of(job));
  const int microbatches = job.global_batch / job.microbatch;
  std::vector<double> losses;
  for (std::uint64_t k = 0; k < steps; ++k) {
    const auto [inputs, targets] = data.batch(samples.step_samples(static_cast<std::int64_t>(k)));
    losses.push_back(executor.run_step(microbatches, inputs, targets) / microbatches);
    executor.commit();
  }
  return losses;
}

spawned_stage spawn_stage(caf::actor_system& sys, const stage_job& job) {
  // One LibTorch thread per stage: the node's cores belong to its stages (and other nodes' on a
  // shared machine); intra-op threads only fight over them.
  torch::set_num_threads(1);
  auto rt = std::make_shared<stage_runtime>(job);
  auto actor = sys.spawn<caf::detached>(stage_behavior, rt);
  return {actor, [rt](const std::string& reason) { rt->abort(reason); }};
}

}  // namespace oobleck::actors
