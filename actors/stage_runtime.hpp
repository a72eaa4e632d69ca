#pragma once
// The runtime a node's stage slot actors share (actors/stage.hpp): its layers across epochs, and
// per epoch its data plane and one executor per stage it runs; what each slot's thread is doing
// (the stall probe); and the operations slot 0 runs on it besides steps: forming an epoch
// (actors/stage_forming.cpp) and applying a commit (actors/stage_commit.cpp). Private to the
// stage library (LibTorch).

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/stage.hpp"
#include "actors/stage_digests.hpp"
#include "runtime/dataset.hpp"
#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/layer_store.hpp"
#include "runtime/loopback_communicator.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stage_executor.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::actors::stage_detail {

using namespace oobleck::messages;


inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// What a slot's thread is doing, for the stall probe (read from the monitor's thread).
struct slot_activity {
  enum : int { idle = 0, computing = 1, waiting = 2 };
  std::atomic<int> state{idle};
  std::atomic<std::int64_t> since_ns{0};
  std::atomic<std::thread::id> owner{};  ///< the slot's thread while it runs a step

  void set(int s) {
    since_ns.store(now_ns());
    state.store(s);
  }
  double ms_in(int s) const {
    if (state.load() != s) return 0;
    return static_cast<double>(now_ns() - since_ns.load()) / 1e6;
  }
};

/// The executor's view of the node's communicator, which records when the slot's own thread
/// waits for its peers (receives, collectives): the rest of a step is compute. A stage computing
/// for long while its peers wait is the culprit of a step that does not finish.
class watched_communicator final : public runtime::communicator {
 public:
  watched_communicator(runtime::communicator& base, slot_activity& activity) : base_(base), activity_(activity) {}
  int rank() const override { return base_.rank(); }
  void send(const torch::Tensor& t, int peer, int tag) override { base_.send(t, peer, tag); }
  void recv(torch::Tensor& t, int peer, int tag) override {
    waiting([&] { base_.recv(t, peer, tag); });
  }
  void all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int tag) override {
    waiting([&] { base_.all_reduce_sum(t, group, tag); });
  }
  void broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int tag) override {
    waiting([&] { base_.broadcast(t, root, group, tag); });
  }
  void abort() override { base_.abort(); }

 private:
  template <class F>
  void waiting(F&& f) {
    if (std::this_thread::get_id() != activity_.owner.load()) return f();  // the reducer's thread
    activity_.set(slot_activity::waiting);
    struct back_to_compute {
      slot_activity& a;
      ~back_to_compute() { a.set(slot_activity::computing); }
    } back{activity_};
    f();
  }

  runtime::communicator& base_;
  slot_activity& activity_;
};

/// Where the job's stages compute: its cluster.device on the worker's GPU (make_device says why a
/// GPU is not there).
inline torch::Device device_of(const stage_job& job) {
  return runtime::make_device(runtime::device_spec{job.device, job.device_index});
}

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
        data(runtime::make_dataset(job.train, job.model.seq_len, job.model.vocab)),
        samples(job.sample_seed, data.size(), job.global_batch),
        store(job.model, device_of(job)),
        activity(static_cast<std::size_t>(slot_count)),
        gradients_done(static_cast<std::size_t>(slot_count), -1) {
    validation.resize(static_cast<std::size_t>(slot_count));
  }

  stage_job job;
  int slots = 1;  ///< M: the node's slot actors, and the widths its stages may add up to
  runtime::token_dataset data;
  runtime::sampler samples;
  /// The validation data of evaluation rounds: read at the first round (a job without [eval] never
  /// reads it). Each slot's thread builds its own (slots run a round together).
  std::vector<std::optional<runtime::token_dataset>> validation;
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
  /// The epoch's NCCL data plane instead of the host transport, when its assignment carries an
  /// NCCL id (runtime/nccl_plane.hpp), and the epoch it belongs to. Written under abort_mu.
  std::unique_ptr<runtime::communicator> nccl;
  std::uint64_t nccl_epoch = 0;
  /// What the executors talk through: `comm`, plus the hand-off between two stages of this node.
  std::unique_ptr<runtime::loopback_communicator> local;  // written under abort_mu
  /// Per stage of the epoch: the executor's communicator (records the slot's waits).
  std::vector<std::unique_ptr<watched_communicator>> watched;
  /// This epoch's views of the store, one per stage of assignment.stages.
  std::vector<std::unique_ptr<runtime::stage_executor>> executors;
  std::vector<std::vector<int>> layer_groups;

  /// Per slot: what its thread is doing (the stall probe). Forming: the newest epoch slot 0
  /// started forming, whether it waits for a step of the node to end, and the newest formed.
  std::vector<slot_activity> activity;
  /// Per slot: the step whose gradients its stage finished summing and still holds (-1: none):
  /// after a coordinator's loss a replacement may ask the node to apply that step's commit.
  /// Written by each slot's own step (under views_mu shared), read under views_mu exclusive.
  std::vector<std::int64_t> gradients_done;
  std::atomic<std::uint64_t> forming_epoch{0};
  std::atomic<bool> forming_blocked{false};
  std::atomic<std::uint64_t> formed_epoch{0};
  std::atomic<std::uint64_t> aborted_epoch{0};  ///< aborted_through, readable without abort_mu
  std::atomic<std::uint64_t> reported_epoch{0};  ///< the newest epoch whose own failure was reported

  /// Where a failure of the node's own stage goes (the monitor): set once, before the first epoch.
  std::mutex sink_mu;
  std::function<void(std::uint64_t, const std::string&, bool)> failure_sink;
  /// Where a stage that applied a commit its stage_step carried says so (the monitor): set once.
  std::function<void(std::uint64_t, std::uint64_t)> commit_sink;  // under sink_mu

  /// The newest commit applied on this node and the node's answer to it: a commit arrives twice
  /// when the next step's orders ride with it (the monitor's commit_step to slot 0 and every
  /// stage_step), and only the first applies it. Taken before views_mu, never while holding it.
  std::mutex commit_mu;
  std::uint64_t applied_epoch = 0;    // guarded by commit_mu
  std::int64_t applied_step = -1;     // guarded by commit_mu
  messages::step_committed applied_answer;  // guarded by commit_mu

  /// The answer to commit (epoch, step) when it is the one applied last, else null. Caller holds
  /// commit_mu.
  const messages::step_committed* answer_to(std::uint64_t epoch, std::uint64_t step) const {
    return applied_epoch == epoch && applied_step == static_cast<std::int64_t>(step) ? &applied_answer : nullptr;
  }

  /// Tells the monitor (commit_sink) that commit (epoch, step) is applied, with its digests where
  /// they were asked for, from any thread.
  void report_applied(std::uint64_t epoch, std::uint64_t step) {
    std::function<void(std::uint64_t, std::uint64_t)> sink;
    {
      std::lock_guard lock(sink_mu);
      sink = commit_sink;
    }
    if (sink) sink(epoch, step);
  }

  /// The stage's own failure (not the data plane's): the epoch's data plane is aborted at once, so
  /// that every peer waiting for this stage fails within milliseconds instead of waiting forever,
  /// and the monitor reports it to the coordinator (a strike towards eviction).
  /// `in_commit`: it failed applying a commit (node_fault::in_commit), not in a step.
  void own_failure(std::uint64_t epoch, const std::string& what, bool in_commit = false) {
    // The report goes out before the abort that lets the peers see the failure, so that the
    // coordinator usually hears whose failure it was before a peer's "connection closed" (two
    // senders: nothing orders them for certain, and the coordinator counts the strike either way).
    // One report per epoch: two slots of the node failing together are one strike of the node.
    if (reported_epoch.exchange(epoch) != epoch) {
      std::function<void(std::uint64_t, const std::string&, bool)> sink;
      {
        std::lock_guard lock(sink_mu);
        sink = failure_sink;
      }
      if (sink) sink(epoch, what, in_commit);
    }
    abort(epoch, "a stage of " + to_string(assignment.rank) + " failed: " + what);
  }

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

  /// Runs the faults armed for `step` (in the middle of it, on the stage's thread) of `epoch`.
  /// Kill and hang fire once; error and stall in every attempt of their step (at most
  /// `attempts` when > 0), an error by throwing, a stall by computing until the epoch is aborted.
  void fire_faults(std::uint64_t epoch, std::uint64_t step) {
    std::vector<std::pair<messages::inject_fault, std::function<void(const messages::inject_fault&)>>> due;
    {
      std::lock_guard lock(fault_mu);
      for (auto it = armed.begin(); it != armed.end();) {
        auto& f = it->first;
        const bool every_attempt = f.kind == fault_kind::error || f.kind == fault_kind::stall;
        if (every_attempt && f.at_step < 0) f.at_step = static_cast<std::int64_t>(step);  // the next step
        if (f.at_step != static_cast<std::int64_t>(step)) {
          ++it;
          continue;
        }
        due.push_back(*it);
        if (every_attempt && (f.attempts <= 0 || --f.attempts > 0))
          ++it;
        else
          it = armed.erase(it);
      }
    }
    for (auto& [f, act] : due) {
      act(f);
      if (f.kind == fault_kind::error) TORCH_CHECK(false, "injected: out of memory");
      if (f.kind == fault_kind::stall) {
        // Busy, as a stuck kernel or a BLAS spinning on an allocation: it answers nothing and
        // sends nothing, while the process (its monitor, heartbeats) stays responsive.
        volatile double x = 1;
        while (aborted_epoch.load() < epoch)
          for (int i = 0; i < 100'000; ++i) x = x * 1.0000001 + 1e-9;
      }
    }
  }

  void abort(std::uint64_t epoch, const std::string& reason) {
    std::lock_guard lock(abort_mu);
    if (epoch < aborted_through) return;
    aborted_through = epoch;
    aborted_epoch.store(epoch);
    abort_reason = reason;
    if (transport && transport->epoch() <= epoch) {
      transport->abort(reason);
      if (local) local->abort();  // wakes a stage waiting for another stage of this node
    }
    if (nccl && nccl_epoch <= epoch) {
      nccl->abort();  // ncclCommAbort on every communicator of the epoch: pending operations fail
      if (local) local->abort();
    }
  }
  /// The digests of the commit applied last when they are computed while the next step runs
  /// (actors/stage_digests.hpp). Last: destroyed (joined) before anything its thread may use.
  deferred_digests digests;
};

/// Executor options of a job (the same for every stage and for the single-process run).
inline runtime::executor_options options_of(const stage_job& job) {
  runtime::executor_options opt;
  opt.microbatch_size = job.microbatch;
  opt.global_microbatches = job.global_batch / job.microbatch;
  opt.optimizer = job.optimizer;
  opt.overlap_gradient_reduce = job.overlap_gradient_reduce;
  return opt;
}

/// An exception's sentence (a c10::Error's without its backtrace).
inline std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

/// The data plane failed (a peer lost, the epoch aborted): not the stage's own fault.
inline bool data_plane_failure(const std::exception& e) {
  return dynamic_cast<const runtime::comm_error*>(&e) || dynamic_cast<const runtime::transport_error*>(&e);
}

inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

/// Checks that the node's slots can run the stages of `a`, drops the old epoch (its uncommitted
/// gradients, its data plane), connects the new mesh, runs the copy plan and builds one executor
/// per stage (actors/stage_forming.cpp). Slot 0's.
form_timing form(stage_runtime& rt, const epoch_assignment& a);

/// Applies commit `c` to every stage of the node, once (actors/stage_commit.cpp, which says how).
step_committed apply_commit(stage_runtime& rt, const commit_step& c, bool deferred = false);

/// The digests of commit (epoch, step) computed on their own thread, into `answer`: waited for
/// when `wait`, else left while they are not ready (false). Throws (after reporting the node's own
/// failure) when computing them failed. Caller holds commit_mu.
bool take_deferred_digests(stage_runtime& rt, std::uint64_t epoch, std::uint64_t step, step_committed& answer,
                           bool wait);

}  // namespace oobleck::actors::stage_detail
