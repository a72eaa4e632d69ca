#include "actors/stage.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include <caf/stateful_actor.hpp>

#include "actors/stage_checkpoint.hpp"
#include "planning/profile.hpp"
#include "runtime/dataset.hpp"
#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/loopback_communicator.hpp"
#include "runtime/sampler.hpp"
#include "runtime/solo_communicator.hpp"
#include "runtime/stage_executor.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// The node's layers and, per epoch, its data plane and one executor per stage it runs. The
/// transport may be aborted from another thread (under `abort_mu`). The node's slot actors share
/// it: slot 0 forms epochs, commits and writes checkpoints, slot j runs the epoch's stage j; the
/// store's layer set and the executors change only under `views_mu` held exclusively (forming,
/// commits), while steps and checkpoints hold it shared. A step never waits for the exclusive
/// lock: two stages of the node run one step together (each waits for the other's messages), so
/// the lock is taken exclusively only when no step runs (the coordinator commits after every
/// stage reported, and starts the next step after every node committed) or after the old epoch's
/// data plane was aborted (forming), which ends any step still under way.
struct stage_runtime {
  stage_runtime(stage_job j, int slot_count)
      : job(std::move(j)),
        slots(slot_count),
        data(runtime::default_corpus(static_cast<std::size_t>(job.corpus_bytes), job.corpus_seed), job.model.seq_len),
        samples(job.sample_seed, data.size(), job.global_batch),
        store(job.model) {}

  stage_job job;
  int slots = 1;  ///< M: the node's slot actors, and the widths its stages may add up to
  runtime::token_dataset data;
  runtime::sampler samples;
  /// The layers, across epochs. Those outside the current stages stay until the epoch has formed
  /// everywhere, which its first commit proves (and no stage of the node runs then): a
  /// reconfiguration that fails part-way must still find every layer where the last formed epoch
  /// put it.
  runtime::layer_store store;
  epoch_assignment assignment;
  bool formed_once = false;  ///< layers exist (built from their seed at the job's first epoch)
  std::shared_mutex views_mu;
  std::uint64_t pruned_epoch = 0;  ///< the epoch whose first commit dropped the layers outside it

  std::mutex abort_mu;
  std::unique_ptr<runtime::host_transport> transport;  // written under abort_mu
  std::uint64_t aborted_through = 0;                   // guarded: epochs <= this are aborted
  std::string abort_reason;                            // guarded

  std::unique_ptr<runtime::host_communicator> comm;
  /// What the executors talk through: `comm`, plus the hand-off between two stages of this node.
  std::unique_ptr<runtime::loopback_communicator> local;  // written under abort_mu
  /// This epoch's views of the store, one per stage of assignment.stages.
  std::vector<std::unique_ptr<runtime::stage_executor>> executors;
  std::vector<std::vector<int>> layer_groups;

  bool runs_layer(planning::layer_index l) const {
    for (const auto& s : assignment.stages)
      if (l >= s.first_layer && l < s.end_layer) return true;
    return false;
  }

  /// The epoch formed everywhere (a step of it committed): layers outside its stages are no longer
  /// anyone's source. Caller holds views_mu exclusively.
  void drop_layers_outside_range() {
    for (int l : store.layers_held())
      if (!runs_layer(planning::layer_index{l})) store.drop(l);
  }

  std::mutex fault_mu;
  std::vector<std::pair<messages::inject_fault, std::function<void(const messages::inject_fault&)>>> armed;

  /// Runs the faults armed for `step` (in the middle of it).
  void fire_faults(std::uint64_t step) {
    std::vector<std::pair<messages::inject_fault, std::function<void(const messages::inject_fault&)>>> due;
    {
      std::lock_guard lock(fault_mu);
      for (auto it = armed.begin(); it != armed.end();)
        if (it->first.at_step == static_cast<std::int64_t>(step)) {
          due.push_back(std::move(*it));
          it = armed.erase(it);
        } else {
          ++it;
        }
    }
    for (auto& [f, act] : due) act(f);
  }

  void abort(std::uint64_t epoch, const std::string& reason) {
    std::lock_guard lock(abort_mu);
    if (epoch < aborted_through) return;
    aborted_through = epoch;
    abort_reason = reason;
    if (transport && transport->epoch() <= epoch) {
      transport->abort(reason);
      if (local) local->abort();  // wakes a stage waiting for another stage of this node
    }
  }
};

/// Executor options of a job (the same for every stage and for the single-process run).
runtime::executor_options options_of(const stage_job& job) {
  runtime::executor_options opt;
  opt.microbatch_size = job.microbatch;
  opt.global_microbatches = job.global_batch / job.microbatch;
  opt.optimizer = job.optimizer;
  opt.overlap_gradient_reduce = job.overlap_gradient_reduce;
  return opt;
}

struct stage_state {
  std::shared_ptr<stage_runtime> rt;
  int slot = 0;  ///< runs the epoch's stage `slot` of this node; slot 0 also forms and commits
  static inline const char* name = "oobleck.stage";
};

using stage_pointer = stage_actor::stateful_pointer<stage_state>;

/// Checks that the node's slots can run the stages it is given: one slot actor per stage, and
/// their widths (the planner's d, a power of two) add up to at most M.
void check_fits_slots(const stage_runtime& rt, const epoch_assignment& a) {
  std::int64_t width = 0;
  for (const auto& s : a.stages) {
    if (!planning::is_power_of_two(s.width))
      throw std::invalid_argument("stage " + std::to_string(s.stage) + " has width " + std::to_string(s.width) +
                                  "; a width is a power of two");
    width += s.width;
  }
  if (static_cast<std::int64_t>(a.stages.size()) > rt.slots || width > rt.slots)
    throw std::invalid_argument("the epoch gives this node " + std::to_string(a.stages.size()) + " stage(s) of " +
                                std::to_string(width) + " slot(s) in all; it has " + std::to_string(rt.slots));
}

form_timing form(stage_runtime& rt, const epoch_assignment& a) {
  form_timing t;
  check_fits_slots(rt, a);
  if (a.rank.value >= static_cast<std::int32_t>(a.peers.size()))
    throw std::invalid_argument(to_string(a.rank) + " is not among the epoch's peers");
  // The old epoch's data plane goes now (it would at its destruction below anyway): a stage of
  // this node still in a step of it fails at once and gives up the views.
  rt.abort(a.epoch - 1, "epoch " + std::to_string(a.epoch) + " is forming");
  std::unique_lock views(rt.views_mu);
  // The old epoch ends here: its uncommitted gradients go, its mesh closes. Its layers stay in
  // the store until an epoch has formed everywhere.
  for (auto& e : rt.executors) e->discard();
  rt.executors.clear();
  {
    std::lock_guard lock(rt.abort_mu);
    rt.local.reset();
  }
  rt.comm.reset();
  {
    std::lock_guard lock(rt.abort_mu);
    rt.transport.reset();
    if (a.epoch <= rt.aborted_through)
      throw std::runtime_error("epoch " + std::to_string(a.epoch) + " was aborted: " + rt.abort_reason);
  }
  rt.assignment = a;
  rt.layer_groups.clear();
  if (a.rank == planning::no_rank) {  // idle: the layers it held are no longer needed
    for (int l : rt.store.layers_held()) rt.store.drop(l);
    return t;
  }

  runtime::transport_config cfg;
  cfg.rank = a.rank.value;
  cfg.epoch = a.epoch;
  cfg.connect_timeout = std::chrono::milliseconds(rt.job.connect_timeout_ms);
  // The buffers of the layers this node receives are allocated and their pages faulted in
  // before its links come up: a copy starts as soon as its link is up, and the pages would
  // otherwise be faulted in during the transfer, on the transport's I/O thread.
  const auto preparing = std::chrono::steady_clock::now();
  std::vector<runtime::copy_entry> copy_plan;
  for (const auto& c : a.copies) copy_plan.push_back({c.layer.value, c.source.value, c.target.value});
  runtime::layer_copies copies(rt.store, a.rank.value, !a.stages.empty(), std::move(copy_plan));
  t.prepare_us = runtime::micros_since(preparing);
  const auto phase = std::chrono::steady_clock::now();
  for (const auto& p : a.peers) cfg.peers.push_back({p.host, p.port});
  {
    std::lock_guard lock(rt.abort_mu);
    rt.transport = std::make_unique<runtime::host_transport>(cfg);
    if (a.epoch <= rt.aborted_through) rt.transport->abort(rt.abort_reason);
  }
  rt.comm = std::make_unique<runtime::host_communicator>(*rt.transport);  // used as its links come up
  // The mesh connects on a thread of its own; each copy starts as soon as its link is up.
  std::exception_ptr connect_failed;
  std::jthread connecting([&] {
    try {
      rt.transport->connect();
    } catch (...) {
      connect_failed = std::current_exception();
    }
    t.connect_us = runtime::micros_since(phase);
  });
  try {
    // Layers are built from their seed only at the job's first epoch (or installed from the
    // checkpoint of a resumed job, which the coordinator names until an epoch has formed
    // everywhere); later a layer is kept (it stayed in the store) or copied.
    for (const auto& s : a.stages) {
      if (!a.resume_dir.empty()) install_from_checkpoint(rt.store, a.resume_dir, s.first_layer, s.end_layer);
      else if (!rt.formed_once) rt.store.ensure(s.first_layer.value, s.end_layer.value);
    }
    const runtime::copy_timing copied = copies.run(*rt.transport, *rt.comm);
    t.copies_us = copied.copies_us;
    t.copy_wait_us = copied.copy_wait_us;
    t.bytes_sent = copied.bytes_sent;
    t.bytes_received = copied.bytes_received;
  } catch (...) {
    // The epoch cannot form here: end a connect() that still waits for peers. A connect() that
    // failed first has aborted the transport with its reason, which the copy's error names.
    rt.transport->abort("forming epoch " + std::to_string(a.epoch) + " failed on " + to_string(a.rank));
    connecting.join();
    throw;
  }
  connecting.join();
  if (connect_failed) std::rethrow_exception(connect_failed);
  {
    std::lock_guard lock(rt.abort_mu);
    rt.local = std::make_unique<runtime::loopback_communicator>(*rt.comm);
    if (a.epoch <= rt.aborted_through) rt.local->abort();
  }

  const auto views_started = std::chrono::steady_clock::now();
  for (const auto& s : a.stages) {
    for (int l = s.first_layer.value; l < s.end_layer.value; ++l)
      if (!rt.store.holds(l))
        throw std::logic_error("epoch " + std::to_string(a.epoch) + ": layer " + std::to_string(l) +
                               " is neither kept nor copied to " + to_string(a.rank));
    // The runtime below speaks plain integers (ranks of this epoch, layer numbers of the model).
    runtime::stage_position pos{s.first_layer.value, s.end_layer.value, s.stage,
                                s.num_stages,        s.prev_rank.value, s.next_rank.value};
    rt.executors.push_back(std::make_unique<runtime::stage_executor>(rt.store, pos, *rt.local, options_of(rt.job)));
  }
  t.views_us = runtime::micros_since(views_started);
  rt.formed_once = true;
  for (const auto& g : a.layer_groups) {
    auto& group = rt.layer_groups.emplace_back();
    for (auto r : g) group.push_back(r.value);
  }
  return t;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

/// Runs the step on the node's stage `slot` (caller holds views_mu shared).
stage_done run(stage_runtime& rt, const stage_step& order, int slot) {
  const auto started = std::chrono::steady_clock::now();
  const auto& s = rt.assignment.stages.at(static_cast<std::size_t>(slot));
  auto& executor = *rt.executors.at(static_cast<std::size_t>(slot));
  // A stage of width d computes with d intra-op threads: the setting belongs to this slot's own
  // thread (OpenMP's thread count is per thread), so the node's stages keep their own widths.
  torch::set_num_threads(s.width);
  stage_done done{order.epoch, order.step, s.pipeline, s.stage, 0, {}};
  try {
    const auto all = rt.samples.step_samples(static_cast<std::int64_t>(order.step));
    const auto b = static_cast<std::size_t>(rt.job.microbatch);
    const std::vector<std::int64_t> ids(all.begin() + static_cast<std::ptrdiff_t>(order.first_microbatch * b),
                                        all.begin() + static_cast<std::ptrdiff_t>((order.first_microbatch + order.microbatches) * b));
    const auto [inputs, targets] = rt.data.batch(ids);
    done.loss_sum = executor.run_step(static_cast<std::int64_t>(order.step), order.first_microbatch,
                                      order.microbatches, inputs, targets, rt.layer_groups);
    rt.fire_faults(order.step);
    executor.reduce_gradients(rt.layer_groups);
  } catch (const std::exception& e) {
    executor.discard();
    done.error = e.what();
  }
  const auto& t = executor.last_step_timing();
  done.timing = {ms_since(started), t.compute_ms, t.p2p_wait_ms, t.allreduce_ms};
  return done;
}

/// Slot 0's: only it forms epochs, applies commits and writes checkpoints for the node.
caf::error slot_zero_only(int slot, const char* what) {
  return make_error(protocol_error::bad_request,
                    std::string(what) + " goes to the node's first stage slot, not slot " + std::to_string(slot));
}

stage_actor::behavior_type stage_behavior(stage_pointer self, std::shared_ptr<stage_runtime> rt, int slot) {
  self->state.rt = std::move(rt);
  self->state.slot = slot;
  return {
      [self](epoch_assignment& a) -> caf::result<form_timing> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "an epoch assignment");
        try {
          return form(*self->state.rt, a);
        } catch (const std::exception& e) {
          return make_error(protocol_error::bad_request, std::string("forming the stage: ") + e.what());
        }
      },
      [self](stage_step& order) -> stage_done {
        auto& rt = *self->state.rt;
        const auto slot = static_cast<std::size_t>(self->state.slot);
        auto not_formed = [&]() -> stage_done {
          return {order.epoch, order.step, -1, -1, 0,
                  "stage slot " + std::to_string(slot) + " is not formed for epoch " + std::to_string(order.epoch)};
        };
        std::shared_lock views(rt.views_mu);
        if (slot >= rt.executors.size() || order.epoch != rt.assignment.epoch) return not_formed();
        return run(rt, order, self->state.slot);
      },
      [self](commit_step& c) -> caf::result<step_committed> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a commit");
        auto& rt = *self->state.rt;
        std::unique_lock views(rt.views_mu);  // no stage of the node runs now (see views_mu)
        const auto started = std::chrono::steady_clock::now();
        step_committed out{c.epoch, c.step, -1, {}};
        if (rt.executors.empty() || c.epoch != rt.assignment.epoch) return out;
        if (rt.pruned_epoch != c.epoch) {  // a step of this epoch committed: it formed everywhere
          rt.drop_layers_outside_range();
          rt.pruned_epoch = c.epoch;
        }
        // Every stage of the node has reported (the coordinator commits only then) and none runs
        // until the next step: this thread applies the step to all of them.
        for (auto& e : rt.executors) {
          e->commit();
          const auto& p = e->position();
          for (int l = p.first_layer; l < p.end_layer; ++l) out.digests.push_back({l, e->parameter_digest(l)});
          out.optimizer_ms += e->last_step_timing().optimizer_ms;
        }
        out.commit_ms = ms_since(started);
        return out;
      },
      [self](write_checkpoint& w) -> caf::result<checkpoint_written> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a checkpoint");
        std::shared_lock views(self->state.rt->views_mu);
        return write_checkpoint_layers(self->state.rt->store, w);
      },
  };
}

}  // namespace

std::vector<double> train_single_process(const stage_job& job, std::uint64_t steps,
                                         std::vector<std::vector<std::byte>>* final_layers) {
  runtime::use_one_compute_thread();
  const runtime::token_dataset data(runtime::default_corpus(static_cast<std::size_t>(job.corpus_bytes), job.corpus_seed),
                                    job.model.seq_len);
  const runtime::sampler samples(job.sample_seed, data.size(), job.global_batch);
  runtime::solo_communicator comm;
  const int layers = job.model.num_layers();
  runtime::layer_store store(job.model);
  store.ensure(0, layers);
  runtime::stage_executor executor(store, {0, layers, 0, 1, -1, -1}, comm, options_of(job));
  const int microbatches = job.global_batch / job.microbatch;
  std::vector<double> losses;
  for (std::uint64_t k = 0; k < steps; ++k) {
    const auto [inputs, targets] = data.batch(samples.step_samples(static_cast<std::int64_t>(k)));
    losses.push_back(executor.run_step(static_cast<std::int64_t>(k), 0, microbatches, inputs, targets) / microbatches);
    executor.commit();
  }
  if (final_layers)
    for (int l = 0; l < layers; ++l) final_layers->push_back(store.serialize_layer(l));
  return losses;
}

spawned_stage spawn_stage(caf::actor_system& sys, const stage_job& job, int slots) {
  if (!planning::is_power_of_two(slots) || slots > 64)
    throw std::invalid_argument("a node has 1, 2, 4, ..., 64 slots, not " + std::to_string(slots));
  // One LibTorch thread per slot: the node's cores belong to its stages (and other nodes' on a
  // shared machine); intra-op threads only fight over them. A stage of width d sets d on its
  // own thread (run()); the BLAS library's pool stays at one thread (it is the process's, not a
  // thread's: runtime/device.hpp).
  runtime::use_one_compute_thread();
  auto rt = std::make_shared<stage_runtime>(job, slots);
  spawned_stage out;
  out.actor = sys.spawn<caf::detached>(stage_behavior, rt, 0);
  for (int j = 1; j < slots; ++j) out.runners.push_back(sys.spawn<caf::detached>(stage_behavior, rt, j));
  out.abort = [rt](std::uint64_t epoch, const std::string& reason) { rt->abort(epoch, reason); };
  out.arm = [rt](const messages::inject_fault& f, std::function<void(const messages::inject_fault&)> act) {
    std::lock_guard lock(rt->fault_mu);
    rt->armed.emplace_back(f, std::move(act));
  };
  return out;
}

}  // namespace oobleck::actors
