// Forming an epoch on a node (slot 0): the old epoch's uncommitted work goes, the new data plane
// connects, the copy plan runs, and one executor per stage views the store (actors/stage.hpp).

#include <algorithm>
#include <string>

#include "actors/stage_checkpoint.hpp"
#include "actors/stage_runtime.hpp"
#include "planning/profile.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/nccl_plane.hpp"

namespace oobleck::actors::stage_detail {

namespace {

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

/// Layers are built from their seed only at the job's first epoch (or installed from the
/// checkpoint of a resumed job, which the coordinator names until an epoch has formed everywhere);
/// later a layer is kept (it stayed in the store) or copied.
void ensure_layers(stage_runtime& rt, const epoch_assignment& a) {
  for (const auto& s : a.stages) {
    if (!a.resume_dir.empty()) install_from_checkpoint(rt.store, a.resume_dir, s.first_layer, s.end_layer);
    else if (!rt.formed_once) rt.store.ensure(s.first_layer.value, s.end_layer.value);
  }
}

/// The node's part of the epoch's copy plan, its incoming layers' buffers allocated and their
/// pages faulted in (layer_copies' constructor) before any link is up.
runtime::layer_copies prepare_copies(stage_runtime& rt, const epoch_assignment& a, form_timing& t) {
  const auto preparing = std::chrono::steady_clock::now();
  std::vector<runtime::copy_entry> copy_plan;
  for (const auto& c : a.copies) copy_plan.push_back({c.layer.value, c.source.value, c.target.value});
  runtime::layer_copies copies(rt.store, a.rank.value, !a.stages.empty(), std::move(copy_plan));
  t.prepare_us = runtime::micros_since(preparing);
  return copies;
}

/// The runtime below speaks plain integers: each layer's gradient group as ranks of the epoch.
std::vector<std::vector<int>> rank_groups(const epoch_assignment& a) {
  std::vector<std::vector<int>> groups;
  for (const auto& g : a.layer_groups) {
    auto& group = groups.emplace_back();
    for (auto r : g) group.push_back(r.value);
  }
  return groups;
}

/// The copies' part of the node's forming time.
void record_copies(form_timing& t, const runtime::copy_timing& copied) {
  t.copies_us = copied.copies_us;
  t.copy_wait_us = copied.copy_wait_us;
  t.bytes_sent = copied.bytes_sent;
  t.bytes_received = copied.bytes_received;
}

/// The host transport's mesh (every link proves the job token over the epoch's nonce), the copies
/// on each link as soon as it is up while the rest connects, then the in-node hand-off over it.
void form_host_plane(stage_runtime& rt, const epoch_assignment& a, form_timing& t) {
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
  cfg.shared_memory = rt.job.shared_memory;  // all-reduces within one machine: no kernel copies
  cfg.spin_wait = std::chrono::microseconds(rt.job.spin_wait_us);  // a receive waits awake first
  // The buffers of the layers this node receives are allocated and their pages faulted in
  // before its links come up: a copy starts as soon as its link is up, and the pages would
  // otherwise be faulted in during the transfer, on the transport's I/O thread.
  runtime::layer_copies copies = prepare_copies(rt, a, t);
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
    ensure_layers(rt, a);
    record_copies(t, copies.run(*rt.transport, *rt.comm, copies.time_limit(cfg.connect_timeout)));
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
}

/// The epoch's NCCL data plane (runtime/nccl_plane.hpp): the world communicator from the epoch's
/// id, then one communicator per link and per gradient group, made alike on every rank from the
/// assignment's lists; then the copies over it, then the in-node hand-off over it. Every wait is
/// abortable: the stage's abort() (the coordinator's forming deadline, a peer's loss) calls
/// ncclCommAbort.
void form_nccl_plane(stage_runtime& rt, const epoch_assignment& a, form_timing& t) {
  if (rt.job.device != "cuda")
    throw std::invalid_argument("epoch " + std::to_string(a.epoch) +
                                " carries tensors over NCCL, but this worker's stages compute on the " + rt.job.device +
                                " (cluster.data_plane \"nccl\" needs cluster.device \"cuda\")");
  runtime::layer_copies copies = prepare_copies(rt, a, t);
  const auto phase = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(rt.abort_mu);
    rt.nccl = runtime::start_nccl_epoch(a.rank.value, static_cast<int>(a.peers.size()), a.nccl_id, rt.job.device_index);
    rt.nccl_epoch = a.epoch;
    if (a.epoch <= rt.aborted_through) rt.nccl->abort();
  }
  std::vector<std::pair<int, int>> links;
  for (const auto& l : a.p2p_links) links.emplace_back(l.from.value, l.to.value);
  try {
    runtime::prepare_nccl_epoch(*rt.nccl, links, rank_groups(a));
    t.connect_us = runtime::micros_since(phase);
    ensure_layers(rt, a);
    record_copies(t, copies.run(*rt.nccl));
  } catch (...) {
    rt.nccl->abort();  // the epoch cannot form here: nothing of this rank's stays pending
    throw;
  }
  std::lock_guard lock(rt.abort_mu);
  rt.local = std::make_unique<runtime::loopback_communicator>(*rt.nccl);
  if (a.epoch <= rt.aborted_through) rt.local->abort();
}

}  // namespace

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
    rt.nccl.reset();
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

  if (a.nccl_id.empty())
    form_host_plane(rt, a, t);
  else
    form_nccl_plane(rt, a, t);

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
  rt.layer_groups = rank_groups(a);
  return t;
}

}  // namespace oobleck::actors::stage_detail
