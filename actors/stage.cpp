#include "actors/stage.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include <caf/stateful_actor.hpp>

#include "actors/stage_checkpoint.hpp"
#include "actors/stage_digests.hpp"
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

std::int64_t now_ns() {
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
torch::Device device_of(const stage_job& job) {
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
  std::function<void(std::uint64_t, const std::string&)> failure_sink;
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

  /// The stage's own failure (not the data plane's): the epoch's data plane is aborted at once, so
  /// that every peer waiting for this stage fails within milliseconds instead of waiting forever,
  /// and the monitor reports it to the coordinator (a strike towards eviction).
  void own_failure(std::uint64_t epoch, const std::string& what) {
    // The report goes out before the abort that lets the peers see the failure, so that the
    // coordinator usually hears whose failure it was before a peer's "connection closed" (two
    // senders: nothing orders them for certain, and the coordinator counts the strike either way).
    // One report per epoch: two slots of the node failing together are one strike of the node.
    if (reported_epoch.exchange(epoch) != epoch) {
      std::function<void(std::uint64_t, const std::string&)> sink;
      {
        std::lock_guard lock(sink_mu);
        sink = failure_sink;
      }
      if (sink) sink(epoch, what);
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
  }
  /// The digests of the commit applied last when they are computed while the next step runs
  /// (actors/stage_digests.hpp). Last: destroyed (joined) before anything its thread may use.
  deferred_digests digests;
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
  rt.forming_epoch.store(a.epoch);
  rt.forming_blocked.store(true);  // until the node's step of the old epoch gives up the views
  std::unique_lock views(rt.views_mu);
  rt.forming_blocked.store(false);
  rt.digests.join();  // a commit's digests still computed read the layers this may replace
  // The old epoch ends here: its uncommitted gradients go, its mesh closes. Its layers stay in
  // the store until an epoch has formed everywhere.
  for (auto& e : rt.executors) e->discard();
  rt.executors.clear();
  std::fill(rt.gradients_done.begin(), rt.gradients_done.end(), -1);
  rt.watched.clear();
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
  if (a.rank == planning::no_rank) {
    // Idle: the layers it holds stay until this epoch has formed everywhere (its first commit,
    // which reaches idle nodes too): if it does not form, the next plan starts again from the
    // last formed configuration, which may ask this node to send them.
    rt.formed_epoch.store(a.epoch);
    return t;
  }

  runtime::transport_config cfg;
  cfg.rank = a.rank.value;
  cfg.epoch = a.epoch;
  cfg.connect_timeout = std::chrono::milliseconds(rt.job.connect_timeout_ms);
  // Every link of the mesh proves the job token (never sent) over this epoch's nonce: without
  // them anyone who knows the epoch and a rank could take the rank or feed the all-reduce.
  if (rt.job.data_token.empty() || a.data_nonce.empty())
    throw std::invalid_argument("the data plane has no key: the worker's job token (stage_job::data_token) and the "
                                "epoch's nonce (epoch_assignment::data_nonce) must both be set");
  cfg.auth_key = rt.job.data_token;
  cfg.auth_nonce = a.data_nonce;
  cfg.max_frame_bytes = runtime::largest_frame_bytes(rt.job.model, rt.job.microbatch);
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
    const runtime::copy_timing copied = copies.run(*rt.transport, *rt.comm, copies.time_limit(cfg.connect_timeout));
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
    runtime::stage_position pos{s.first_layer.value, s.end_layer.value, s.stage,          s.num_stages,
                                s.prev_rank.value,   s.next_rank.value, s.first_rank.value, s.last_rank.value};
    const std::size_t slot = rt.executors.size();
    rt.watched.push_back(std::make_unique<watched_communicator>(*rt.local, rt.activity.at(slot)));
    rt.executors.push_back(std::make_unique<runtime::stage_executor>(rt.store, pos, *rt.watched.back(), options_of(rt.job)));
  }
  t.views_us = runtime::micros_since(views_started);
  rt.formed_once = true;
  rt.formed_epoch.store(a.epoch);
  for (const auto& g : a.layer_groups) {
    auto& group = rt.layer_groups.emplace_back();
    for (auto r : g) group.push_back(r.value);
  }
  return t;
}

/// An exception's sentence (a c10::Error's without its backtrace).
std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

/// The data plane failed (a peer lost, the epoch aborted): not the stage's own fault.
bool data_plane_failure(const std::exception& e) {
  return dynamic_cast<const runtime::comm_error*>(&e) || dynamic_cast<const runtime::transport_error*>(&e);
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
  auto& activity = rt.activity.at(static_cast<std::size_t>(slot));
  activity.owner.store(std::this_thread::get_id());
  activity.set(slot_activity::computing);
  struct idle_after {
    slot_activity& a;
    ~idle_after() {
      a.set(slot_activity::idle);
      a.owner.store({});
    }
  } idle{activity};
  try {
    if (order.eval) {
      // An evaluation round: forward passes over validation windows, nothing to commit.
      auto& validation = rt.validation.at(static_cast<std::size_t>(slot));
      if (!validation) {
        if (rt.job.validation.empty()) throw std::runtime_error("the job has no validation data ([data] validation)");
        validation.emplace(runtime::make_dataset(rt.job.validation, rt.job.model.seq_len, rt.job.model.vocab));
      }
      if (order.first_microbatch < 0 || order.microbatches < 0 ||
          order.first_microbatch + order.microbatches > validation->size())
        throw std::invalid_argument("validation windows [" + std::to_string(order.first_microbatch) + ", " +
                                    std::to_string(order.first_microbatch + order.microbatches) +
                                    ") are not inside the validation data's " + std::to_string(validation->size()));
      std::vector<std::int64_t> ids(static_cast<std::size_t>(order.microbatches));
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = order.first_microbatch + static_cast<std::int64_t>(i);
      const auto [inputs, targets] = validation->batch(ids);
      done.loss_sum = executor.run_eval(order.microbatches, inputs, targets);
      done.timing.busy_ms = ms_since(started);
      return done;
    }
    const auto all = rt.samples.step_samples(static_cast<std::int64_t>(order.step));
    const auto b = static_cast<std::size_t>(rt.job.microbatch);
    const std::vector<std::int64_t> ids(all.begin() + static_cast<std::ptrdiff_t>(order.first_microbatch * b),
                                        all.begin() + static_cast<std::ptrdiff_t>((order.first_microbatch + order.microbatches) * b));
    const auto [inputs, targets] = rt.data.batch(ids);
    done.loss_sum = executor.run_step(static_cast<std::int64_t>(order.step), order.first_microbatch,
                                      order.microbatches, inputs, targets, rt.layer_groups);
    rt.fire_faults(order.epoch, order.step);
    activity.set(slot_activity::waiting);  // for the all-reduces (they run on the reducer's thread too)
    executor.reduce_gradients(rt.layer_groups);
    if (rt.job.optimizer.clip_norm > 0) done.grad_sq = executor.gradient_sq_norm();
    rt.gradients_done.at(static_cast<std::size_t>(slot)) = static_cast<std::int64_t>(order.step);
  } catch (const std::exception& e) {
    rt.gradients_done.at(static_cast<std::size_t>(slot)) = -1;
    done.error = what_of(e);
    // This stage's own failure (out of memory, a c10::Error): its peers must not wait for it. Told
    // before anything else: discarding the step cancels its all-reduces, its peers fail, and the
    // coordinator's abort of the epoch could otherwise arrive first and hide whose failure it was.
    if (!data_plane_failure(e) && rt.aborted_epoch.load() < order.epoch) rt.own_failure(order.epoch, done.error);
    if (!order.eval) executor.discard();
  }
  const auto& t = executor.last_step_timing();
  done.timing = {ms_since(started), t.compute_ms, t.p2p_wait_ms, t.allreduce_ms};
  if (done.error.empty()) {
    done.forward_ms.assign(t.forward_op_ms.begin(), t.forward_op_ms.end());
    done.backward_ms.assign(t.backward_op_ms.begin(), t.backward_op_ms.end());
  }
  return done;
}

/// What the layers' digests of the node's stages are computed over after a commit (where the
/// coordinator checks replicas). Caller holds views_mu.
digest_inputs digest_inputs_of(stage_runtime& rt) {
  const auto& model = rt.store.model();
  digest_inputs in;
  for (auto& e : rt.executors) {
    const auto& p = e->position();
    for (int l = p.first_layer; l < p.end_layer; ++l) {
      in.layers.emplace_back(l, rt.store.flat_parameters(l));
      if (runtime::tied(model) && (l == 0 || l == model.num_layers() - 1))
        in.tied.emplace_back(l, rt.store.flat_parameters(l).slice(0, 0, model.vocab * model.d_model));
    }
  }
  return in;
}

/// The layers' digests of the node's stages, now. Caller holds views_mu.
void add_digests(stage_runtime& rt, step_committed& out) { compute_digests(digest_inputs_of(rt), out); }

/// Hands the digests of commit (epoch, step) to their own thread (stage_digests.hpp): the step
/// whose orders carried the commit runs meanwhile. The monitor hears when they are ready. Caller
/// holds commit_mu and views_mu exclusively, and has just applied the commit.
void defer_digests(stage_runtime& rt, std::uint64_t epoch, std::uint64_t step) {
  const auto device = rt.store.device();
  rt.digests.start(
      epoch, step, digest_inputs_of(rt), [device] { runtime::use_device_on_this_thread(device); },
      [&rt, epoch, step] {
        std::function<void(std::uint64_t, std::uint64_t)> sink;
        {
          std::lock_guard lock(rt.sink_mu);
          sink = rt.commit_sink;
        }
        if (sink) sink(epoch, step);
      });
}

/// The digests of commit (epoch, step) computed on their own thread, into `answer`: waited for
/// when `wait`, else left while they are not ready (false). Throws (after reporting the node's own
/// failure) when computing them failed. Caller holds commit_mu.
bool take_deferred_digests(stage_runtime& rt, std::uint64_t epoch, std::uint64_t step, step_committed& answer,
                           bool wait) {
  if (wait) rt.digests.join();
  std::string error;
  switch (rt.digests.take(epoch, step, answer, error)) {
    case deferred_digests::taken::not_ready: return false;
    case deferred_digests::taken::failed: {
      const std::string what = "the digests of step " + std::to_string(step) + ": " + error;
      rt.own_failure(epoch, what);
      throw std::runtime_error(what);
    }
    default: return true;
  }
}

/// Applies commit `c` to every stage of the node, once. The commit applied last (the same epoch
/// and step) answers what it answered then (with digests computed now if they were not asked for
/// then); an older one of the same epoch changes nothing and answers without digests (steps
/// commit in order, each once; only a new epoch may start again from a checkpoint's earlier
/// step). Such late copies are ordinary with run-ahead: slot 0's copy of commit k may wait in its
/// mailbox behind step k + 1, whose orders applied k, and then behind k + 1's own commit, applied
/// by step k + 2's orders. A commit of another epoch than the node's changes nothing. Throws
/// (after reporting the node's own failure) when applying fails: part of the step may be applied.
/// `deferred`: the commit rode with the next step's orders (which a slot runs next); its digests
/// are then computed on their own thread meanwhile (defer_digests), the answer returned has none,
/// and the monitor collects them when that thread says they are ready (stage_runtime's
/// commit_sink, then spawned_stage::applied).
step_committed apply_commit(stage_runtime& rt, const commit_step& c, bool deferred = false) {
  std::lock_guard commit_lock(rt.commit_mu);
  if (const auto* answer = rt.answer_to(c.epoch, c.step)) {
    // Orders that carried it need nothing more; slot 0's copy of a commit sent with orders
    // answers without waiting for digests still computed (the monitor waits for their nudge).
    take_deferred_digests(rt, c.epoch, c.step, rt.applied_answer, !deferred);
    if (deferred) return *answer;
    step_committed again = *answer;
    if (c.digests && again.digests.empty()) {
      std::shared_lock views(rt.views_mu);
      if (c.epoch == rt.assignment.epoch) add_digests(rt, again);
    }
    return again;
  }
  if (c.epoch == rt.applied_epoch && static_cast<std::int64_t>(c.step) < rt.applied_step)
    return {c.epoch, c.step, -1, {}};
  std::unique_lock views(rt.views_mu);  // no stage of the node runs now (see views_mu)
  rt.digests.join();  // the last commit's digests, if still computed, read what this one updates
  const auto started = std::chrono::steady_clock::now();
  step_committed out{c.epoch, c.step, -1, {}};
  if (c.epoch != rt.assignment.epoch) return out;
  if (rt.pruned_epoch != c.epoch) {  // a step of this epoch committed: it formed everywhere
    rt.drop_layers_outside_range();  // an idle node: every layer it kept for a failed forming
    rt.pruned_epoch = c.epoch;
  }
  // Every stage of the node has reported (the coordinator commits only then) and none runs until
  // the next step: this thread applies the step to all of them.
  try {
    for (auto& e : rt.executors) {
      e->commit(c.grad_scale.value);
      out.optimizer_ms += e->last_step_timing().optimizer_ms;
    }
    if (c.digests && !deferred) add_digests(rt, out);
  } catch (const std::exception& e) {
    // Part of the step may be applied: this node's layers are no longer the committed state.
    const std::string what = "applying the commit of step " + std::to_string(c.step) + ": " + what_of(e);
    rt.own_failure(c.epoch, what);
    throw std::runtime_error(what);
  }
  std::fill(rt.gradients_done.begin(), rt.gradients_done.end(), -1);
  out.commit_ms = ms_since(started);
  rt.applied_epoch = c.epoch;
  rt.applied_step = static_cast<std::int64_t>(c.step);
  rt.applied_answer = out;
  if (c.digests && deferred) defer_digests(rt, c.epoch, c.step);
  return out;
}

/// Slot 0's: only it forms epochs, applies commits and writes checkpoints for the node.
caf::error slot_zero_only(int slot, const char* what) {
  return make_error(protocol_error::bad_request,
                    std::string(what) + " goes to the node's first stage slot, not slot " + std::to_string(slot));
}

stage_actor::behavior_type stage_behavior(stage_pointer self, std::shared_ptr<stage_runtime> rt, int slot) {
  self->state.rt = std::move(rt);
  self->state.slot = slot;
  runtime::use_device_on_this_thread(self->state.rt->store.device());  // a detached actor: its own thread
  return {
      [self](epoch_assignment& a) -> caf::result<form_timing> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "an epoch assignment");
        auto& rt = *self->state.rt;
        try {
          return form(rt, a);
        } catch (const std::exception& e) {
          // A copy or an allocation that failed here (not a peer, not an abort) is this node's.
          if (!data_plane_failure(e) && rt.aborted_epoch.load() < a.epoch) rt.own_failure(a.epoch, what_of(e));
          return make_error(protocol_error::bad_request, "forming the stage: " + what_of(e));
        }
      },
      [self](stage_step& order) -> stage_done {
        auto& rt = *self->state.rt;
        const auto slot = static_cast<std::size_t>(self->state.slot);
        auto not_formed = [&]() -> stage_done {
          return {order.epoch, order.step, -1, -1, 0,
                  "stage slot " + std::to_string(slot) + " is not formed for epoch " + std::to_string(order.epoch)};
        };
        if (order.commit_first) {
          // The previous step's commit rode with these orders: applied here unless the monitor's
          // commit_step or another slot's order applied it already; the monitor hears at once.
          if (order.commit.epoch != order.epoch || order.commit.step + 1 != order.step)
            return {order.epoch, order.step, -1, -1, 0,
                    "the commit sent with step " + std::to_string(order.step) + " is not its previous step's"};
          try {
            apply_commit(rt, order.commit, true);
          } catch (const std::exception& e) {
            return {order.epoch, order.step, -1, -1, 0, e.what()};
          }
          // With digests asked for, their thread tells the monitor once they are ready.
          if (!order.commit.digests) {
            std::function<void(std::uint64_t, std::uint64_t)> sink;
            {
              std::lock_guard lock(rt.sink_mu);
              sink = rt.commit_sink;
            }
            if (sink) sink(order.commit.epoch, order.commit.step);
          }
        }
        std::shared_lock views(rt.views_mu);
        if (slot >= rt.executors.size() || order.epoch != rt.assignment.epoch) return not_formed();
        return run(rt, order, self->state.slot);
      },
      [self](commit_step& c) -> caf::result<step_committed> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a commit");
        try {
          // With the next step's orders on their way (with_run), its digests are computed while
          // that step runs, wherever the commit is applied first.
          return apply_commit(*self->state.rt, c, c.with_run);
        } catch (const std::exception& e) {
          return make_error(protocol_error::bad_request, "commit failed: " + std::string(e.what()));
        }
      },
      [self](memory_atom) -> caf::result<node_memory> {
        if (self->state.slot != 0) return slot_zero_only(self->state.slot, "a memory request");
        // What the node kept for a replacement coordinator: every layer with its digest and
        // update count, and whether its stages still hold a finished step's gradients. Asked
        // after the data plane was aborted, so no step of the node still runs.
        auto& rt = *self->state.rt;
        std::unique_lock views(rt.views_mu);
        node_memory m;
        m.views_epoch = rt.formed_epoch.load();
        if (!rt.executors.empty()) {
          const std::int64_t step = rt.gradients_done.front();
          bool all = true;
          for (std::size_t j = 0; j < rt.executors.size(); ++j) all = all && rt.gradients_done.at(j) == step;
          if (all) m.gradients_step = step;
        }
        for (int l : rt.store.layers_held())
          m.layers.push_back({planning::layer_index{l}, rt.store.parameter_digest(l), rt.store.optimizer_state(l).step});
        return m;
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
  const runtime::token_dataset data = runtime::make_dataset(job.train, job.model.seq_len, job.model.vocab);
  const runtime::sampler samples(job.sample_seed, data.size(), job.global_batch);
  runtime::solo_communicator comm;
  const int layers = job.model.num_layers();
  // On the job's device, as the stages: a GPU job's reference run is on the same GPU.
  runtime::layer_store store(job.model, device_of(job));
  store.ensure(0, layers);
  runtime::stage_executor executor(store, {0, layers, 0, 1, -1, -1}, comm, options_of(job));
  const int microbatches = job.global_batch / job.microbatch;
  std::vector<double> losses;
  for (std::uint64_t k = 0; k < steps; ++k) {
    const auto [inputs, targets] = data.batch(samples.step_samples(static_cast<std::int64_t>(k)));
    losses.push_back(executor.run_step(static_cast<std::int64_t>(k), 0, microbatches, inputs, targets) / microbatches);
    executor.tie_gradients();
    const double norm = job.optimizer.clip_norm > 0 ? std::sqrt(executor.gradient_sq_norm()) : 0;
    executor.commit(runtime::clip_scale(job.optimizer.clip_norm, norm));
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
  out.activity = [rt] {
    messages::stall_report r;
    r.epoch = rt->forming_epoch.load();
    r.formed = rt->formed_epoch.load() >= r.epoch;
    r.forming_blocked = rt->forming_blocked.load();
    double computing = 0, waiting = 0;
    for (const auto& a : rt->activity) {
      computing = std::max(computing, a.ms_in(slot_activity::computing));
      waiting = std::max(waiting, a.ms_in(slot_activity::waiting));
    }
    r.computing_ms = computing;
    r.waiting_ms = waiting;
    return r;
  };
  out.report_failures_to = [rt](std::function<void(std::uint64_t, const std::string&)> sink) {
    std::lock_guard lock(rt->sink_mu);
    rt->failure_sink = std::move(sink);
  };
  out.applied = [rt](std::uint64_t epoch, std::uint64_t step) -> std::optional<messages::step_committed> {
    std::lock_guard lock(rt->commit_mu);
    if (!rt->answer_to(epoch, step)) return std::nullopt;
    // Digests computed while the next step runs: their thread says when they are ready. One that
    // failed is reported by slot 0's reply to the commit (it throws there).
    try {
      if (!take_deferred_digests(*rt, epoch, step, rt->applied_answer, false)) return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;
    }
    return rt->applied_answer;
  };
  out.digests_coming = [rt](std::uint64_t epoch, std::uint64_t step) { return rt->digests.holds(epoch, step); };
  out.report_commits_to = [rt](std::function<void(std::uint64_t, std::uint64_t)> sink) {
    std::lock_guard lock(rt->sink_mu);
    rt->commit_sink = std::move(sink);
  };
  return out;
}

}  // namespace oobleck::actors
