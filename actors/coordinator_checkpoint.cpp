#include "actors/coordinator_checkpoint.hpp"

#include <algorithm>
#include <exception>
#include <map>

#include "actors/coordinator_training.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// Per layer, the live nodes that hold it: the holders in the last configuration that formed
/// everywhere (their layers are the committed state), minus the lost ones. Empty lists are layers
/// nobody alive holds.
std::map<layer_index, std::vector<node_id>> surviving_holders(const coordinator_state& st, std::int32_t& layers) {
  const auto ep = planning::map_epoch(st.templates, st.formed.pipelines, {});
  layers = ep.num_layers();
  std::map<layer_index, std::vector<node_id>> out;
  for (int l = 0; l < ep.num_layers(); ++l) {
    auto& list = out[layer_index{l}];
    for (auto r : ep.holders(layer_index{l})) {
      const node_id node = ep.node(r);
      const auto it = st.nodes.find(node);
      if (it != st.nodes.end() && it->second.state != node_state::lost) list.push_back(node);
    }
  }
  return out;
}

std::string list(const std::vector<layer_index>& layers) {
  std::string out;
  for (auto l : layers) out += (out.empty() ? "" : ", ") + std::to_string(l.value);
  return out;
}

/// Ends the job after "checkpoint and stop", with or without a checkpoint.
void finish_stop(coordinator_pointer self, const std::string& reason, const std::optional<std::string>& dir,
                 const std::string& why_none) {
  auto& st = self->state;
  auto& ck = st.deps.checkpoint;
  checkpoint_stop_record rec{reason, dir, std::nullopt, st.step};
  if (dir) {
    st.deps.log("checkpoint of step " + std::to_string(st.step) + " written to " + *dir);
    st.deps.log("resume with: " + ck.resume_command(*dir));
  } else {
    std::string latest;
    try {
      latest = ck.latest();
    } catch (const std::exception&) {
    }
    if (latest.empty()) latest = st.last_checkpoint;
    st.deps.log("no checkpoint could be written: " + why_none);
    if (!latest.empty()) {
      rec.latest = latest;
      st.deps.log("the latest checkpoint is " + latest + " (the steps after it run again): resume with: " +
                  ck.resume_command(latest));
    } else {
      st.deps.log("there is no earlier checkpoint either: the job's trained state is lost");
    }
  }
  ck.on_stop(rec);
  stop_job(self, stop_outcome::checkpoint_and_stop, "checkpoint and stop: " + reason);
}

/// The checkpoint failed: its directory goes; a fallback stops without one, a periodic one lets
/// training go on. The phase is left.
void fail(coordinator_pointer self, phase::checkpointing& ph, const std::string& why) {
  auto& st = self->state;
  const auto progress = std::move(ph.progress);
  try {
    st.deps.checkpoint.discard(progress.temp);
  } catch (const std::exception&) {
  }
  if (progress.stop_after) return finish_stop(self, progress.reason, std::nullopt, why);
  st.deps.log("checkpoint of step " + std::to_string(progress.step) + " failed: " + why + "; training goes on");
  after_commit(self);
}

/// Asks the least loaded remaining candidate of each layer in `layers` to write it. False when a
/// layer has no candidate left: the checkpoint failed and the phase was left.
bool ask(coordinator_pointer self, phase::checkpointing& ph, const std::vector<layer_index>& layers) {
  auto& st = self->state;
  auto& ck = ph.progress;
  std::map<node_id, std::vector<layer_index>> orders;
  for (auto layer : layers) {
    auto& cands = ck.candidates[layer];
    std::erase_if(cands, [&](node_id n) { return st.nodes.at(n).state == node_state::lost; });
    if (cands.empty()) {
      fail(self, ph, to_string(layer) + " has no surviving holder that could write it");
      return false;
    }
    const auto best = std::min_element(cands.begin(), cands.end(), [&](node_id a, node_id b) {
      return ck.asked[a].size() < ck.asked[b].size();
    });
    const node_id node = *best;
    cands.erase(best);
    ck.asked[node].push_back(layer);
    orders[node].push_back(layer);
  }
  for (auto& [node, ls] : orders)
    self->send(st.nodes.at(node).monitor, write_checkpoint{ck.request, ck.step, ck.temp, std::move(ls)});
  return true;
}

bool all_written(const checkpoint_progress& ck) {
  for (const auto& [node, layers] : ck.asked)
    if (!layers.empty()) return false;
  return static_cast<std::int32_t>(ck.files.size()) == ck.num_layers;
}

/// Every layer written: the manifest, the rename; then the stop or the next step.
void complete(coordinator_pointer self, phase::checkpointing& ph) {
  auto& st = self->state;
  std::string dir;
  try {
    dir = st.deps.checkpoint.finish(ph.progress.temp, ph.progress.step, ph.progress.files);
  } catch (const std::exception& e) {
    return fail(self, ph, e.what());
  }
  const auto progress = std::move(ph.progress);
  st.last_checkpoint = dir;
  std::uint64_t bytes = 0;
  for (const auto& f : progress.files) bytes += f.bytes;
  const double ms = std::chrono::duration<double, std::milli>(st.deps.now() - progress.started).count();
  publish(self, {event_kind::checkpoint_written, st.epoch, progress.step, -1, 0, dir});
  if (progress.stop_after) return finish_stop(self, progress.reason, dir, {});
  st.deps.log("checkpoint of step " + std::to_string(progress.step) + " written to " + dir + " (" +
              std::to_string(progress.files.size()) + " layer files, " + std::to_string(bytes) + " bytes, " +
              std::to_string(static_cast<long long>(ms)) + " ms)");
  after_commit(self);
}

/// Starts writing a checkpoint of the committed state (step st.step) by the surviving holders.
void start(coordinator_pointer self, bool stop_after, const std::string& reason) {
  auto& st = self->state;
  checkpoint_progress ck;
  ck.request = ++st.checkpoint_requests;
  ck.step = st.step;
  ck.started = st.deps.now();
  ck.stop_after = stop_after;
  ck.reason = reason;
  std::map<layer_index, std::vector<node_id>> holders;
  try {
    holders = surviving_holders(st, ck.num_layers);
  } catch (const std::exception& e) {
    if (stop_after) return finish_stop(self, reason, std::nullopt, std::string("no configuration to write from: ") + e.what());
    st.deps.log(std::string("checkpoint skipped: ") + e.what());
    return after_commit(self);
  }
  std::vector<layer_index> orphans;
  for (const auto& [layer, nodes] : holders)
    if (nodes.empty()) orphans.push_back(layer);
  if (!orphans.empty()) {
    const std::string why = "layer(s) " + list(orphans) + " have no surviving holder";
    if (stop_after) return finish_stop(self, reason, std::nullopt, why);
    st.deps.log("checkpoint skipped: " + why);
    return after_commit(self);
  }
  try {
    ck.temp = st.deps.checkpoint.begin(ck.step);
  } catch (const std::exception& e) {
    if (stop_after) return finish_stop(self, reason, std::nullopt, e.what());
    st.deps.log(std::string("checkpoint of step ") + std::to_string(ck.step) + " failed: " + e.what() + "; training goes on");
    return after_commit(self);
  }
  ck.candidates = std::move(holders);
  std::vector<layer_index> all;
  for (std::int32_t l = 0; l < ck.num_layers; ++l) all.push_back(layer_index{l});
  st.deps.log(std::string(stop_after ? "writing a checkpoint of step " : "periodic checkpoint of step ") +
              std::to_string(st.step) + " (" + std::to_string(all.size()) + " layers) to " + st.deps.checkpoint.root);
  auto& ph = enter(self, phase::checkpointing{std::move(ck)});
  ask(self, ph, all);
}

}  // namespace

bool maybe_periodic_checkpoint(coordinator_pointer self) {
  auto& st = self->state;
  const auto& ck = st.deps.checkpoint;
  if (ck.every == 0 || ck.root.empty() || st.step == 0 || st.step % ck.every != 0) return false;
  start(self, false, {});
  return true;
}

void checkpoint_and_stop(coordinator_pointer self, const std::string& reason) {
  auto& st = self->state;
  st.deps.log("the reconfiguration policy says checkpoint and stop: " + reason);
  if (st.deps.checkpoint.root.empty())
    return finish_stop(self, reason, std::nullopt,
                       "no checkpoint directory is configured (--checkpoint-dir, or [checkpoint] dir in the job file)");
  start(self, true, reason);
}

bool handle(coordinator_pointer self, phase::checkpointing& ph, checkpoint_written& w) {
  auto& st = self->state;
  auto& ck = ph.progress;
  if (w.request != ck.request) return false;
  if (!w.error.empty()) {
    fail(self, ph, to_string(w.node) + ": " + w.error);
    return true;
  }
  auto& asked = ck.asked[w.node];
  for (const auto& f : w.files) {
    if (std::erase(asked, f.layer) == 0) continue;  // not asked of this node (a bug): ignore it
    ck.files.push_back(f);
  }
  std::vector<layer_index> again;
  for (auto l : w.missing)
    if (std::erase(asked, l) > 0) again.push_back(l);
  if (!again.empty()) {
    st.deps.log(to_string(w.node) + " no longer holds layer(s) " + list(again) + ": asking another holder");
    if (!ask(self, ph, again)) return true;  // failed: the phase is gone
  }
  if (all_written(ck)) complete(self, ph);
  return true;
}

void fallback_writer_lost(coordinator_pointer self, phase::checkpointing& ph, node_id node) {
  auto& st = self->state;
  auto& ck = ph.progress;
  const auto it = ck.asked.find(node);
  if (it == ck.asked.end() || it->second.empty()) return;
  auto again = std::move(it->second);
  ck.asked.erase(it);
  st.deps.log(to_string(node) + " was lost while writing layer(s) " + list(again) +
              ": asking another holder");
  if (!ask(self, ph, again)) return;
  if (all_written(ck)) complete(self, ph);
}

void abandon_periodic_checkpoint(coordinator_pointer self, phase::checkpointing& ph, const std::string& why) {
  auto& st = self->state;
  try {
    st.deps.checkpoint.discard(ph.progress.temp);
  } catch (const std::exception&) {
  }
  st.deps.log("checkpoint of step " + std::to_string(ph.progress.step) + " abandoned: " + why);
}

}  // namespace oobleck::actors
