#include "actors/coordinator_checkpoint.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <memory>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>

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

/// Runs `work` (file operations: they block) in a helper actor of its own, detached when
/// deps.checkpoint.off_thread, and calls `done` on the coordinator with its result, or nullopt and
/// the error's sentence. The coordinator answers other messages meanwhile.
void run_io(coordinator_pointer self, std::function<std::string()> work,
            std::function<void(std::optional<std::string>, const std::string&)> done) {
  auto body = [work = std::move(work)](caf::event_based_actor* h) -> caf::behavior {
    return {[h, work](const std::string&) {
      auto rp = h->make_response_promise();
      try {
        rp.deliver(work());
      } catch (const std::exception& e) {
        rp.deliver(make_error(protocol_error::bad_request, std::string(e.what())));
      }
      h->quit();
    }};
  };
  const caf::actor helper =
      self->state.deps.checkpoint.off_thread ? self->spawn<caf::detached>(body) : self->spawn(body);
  self->request(helper, caf::infinite, std::string("run"))
      .then([done](std::string& out) { done(std::move(out), {}); },
            [done](caf::error& e) {
              std::string what = describe(e);
              if (is_protocol_error(e) && e.context().match_elements<std::string>())
                what = e.context().get_as<std::string>(0);
              done(std::nullopt, what);
            });
}

/// Removes a temporary checkpoint directory, off the coordinator's thread; nothing waits for it.
void discard_later(coordinator_pointer self, const std::string& temp) {
  if (temp.empty()) return;
  auto discard = self->state.deps.checkpoint.discard;
  run_io(
      self,
      [discard, temp] {
        discard(temp);
        return std::string();
      },
      [](std::optional<std::string>, const std::string&) {});
}

/// The checkpoint in progress when it is request `request` (and not abandoned), else null.
phase::checkpointing* current(coordinator_pointer self, std::uint64_t request) {
  auto* ph = std::get_if<phase::checkpointing>(&self->state.phase);
  return ph && ph->progress.request == request && !ph->progress.abandoned ? ph : nullptr;
}

/// Ends the job after a checkpoint before stopping, with or without one.
void finish_stop(coordinator_pointer self, stop_outcome outcome, const std::string& reason,
                 const std::optional<std::string>& dir, const std::string& why_none) {
  auto& st = self->state;
  auto& ck = st.deps.checkpoint;
  checkpoint_stop_record rec{reason, dir, std::nullopt, st.step};
  if (outcome != stop_outcome::checkpoint_and_stop && ck.root.empty()) {
    // Checkpoints are not used by this job: it stops as it always did, saying why none was written.
    st.deps.log("no checkpoint written before stopping: " + why_none);
    return stop_job(self, outcome, reason);
  }
  std::string said;
  if (dir) {
    st.deps.log("checkpoint of step " + std::to_string(st.step) + " written to " + *dir);
    st.deps.log("resume with: " + ck.resume_command(*dir));
    said = "checkpoint of step " + std::to_string(st.step) + " written to " + *dir;
  } else {
    std::string latest;
    try {
      latest = ck.latest();
    } catch (const std::exception&) {
    }
    if (latest.empty()) latest = st.last_checkpoint;
    st.deps.log("no checkpoint could be written: " + why_none);
    said = "no checkpoint written: " + why_none;
    if (!latest.empty()) {
      rec.latest = latest;
      st.deps.log("the latest checkpoint is " + latest + " (the steps after it run again): resume with: " +
                  ck.resume_command(latest));
    } else if (outcome == stop_outcome::checkpoint_and_stop && st.deps.wait_below_minimum && every_layer_held(st)) {
      st.deps.log("there is no earlier checkpoint either: the survivors' memory holds the job's state");
    } else {
      st.deps.log("there is no earlier checkpoint either: the job's trained state is lost");
    }
  }
  if (outcome == stop_outcome::checkpoint_and_stop) {
    if (wait_for_nodes(self, rec)) return;  // below the minimum, a job that waits for nodes instead
    ck.on_stop(rec);
    return stop_job(self, outcome, "checkpoint and stop: " + reason);
  }
  stop_job(self, outcome, reason + " (" + said + ")");
}

/// The checkpoint failed: its directory goes; one before a stop stops without it, a periodic one
/// lets training go on. The phase is left.
void fail(coordinator_pointer self, phase::checkpointing& ph, const std::string& why) {
  auto& st = self->state;
  const auto progress = std::move(ph.progress);
  discard_later(self, progress.temp);
  if (progress.stop_after) return finish_stop(self, progress.outcome, progress.reason, std::nullopt, why);
  st.deps.log("checkpoint of step " + std::to_string(progress.step) + " failed: " + why + "; training goes on");
  after_commit(self);
}

/// How long `layers` may take a writer (see the header).
std::chrono::milliseconds write_deadline(const coordinator_state& st, const std::vector<layer_index>& layers) {
  const auto& ck = st.deps.checkpoint;
  double bytes = 0;
  for (auto l : layers)
    if (l.value >= 0 && static_cast<std::size_t>(l.value) < st.deps.profile.layers.size())
      bytes += 3.0 * static_cast<double>(st.deps.profile.layers[static_cast<std::size_t>(l.value)].param_bytes);
  const double extra_ms = ck.write_bytes_per_second > 0 ? bytes / ck.write_bytes_per_second * 1000 : 0;
  return ck.write_floor + std::chrono::milliseconds(static_cast<std::int64_t>(extra_ms));
}

/// Asks the least loaded remaining candidate of each layer in `layers` to write it. False when a
/// layer has no candidate left: the checkpoint failed (naming every such layer) and the phase was left.
bool ask(coordinator_pointer self, phase::checkpointing& ph, const std::vector<layer_index>& layers) {
  auto& st = self->state;
  auto& ck = ph.progress;
  std::map<node_id, std::vector<layer_index>> orders;
  std::vector<layer_index> orphans;
  for (auto layer : layers) {
    auto& cands = ck.candidates[layer];
    std::erase_if(cands, [&](node_id n) { return st.nodes.at(n).state == node_state::lost || ck.failed.count(n); });
    if (cands.empty()) {
      orphans.push_back(layer);
      continue;
    }
    const auto best = std::min_element(cands.begin(), cands.end(), [&](node_id a, node_id b) {
      return ck.asked[a].size() < ck.asked[b].size();
    });
    const node_id node = *best;
    cands.erase(best);
    ck.asked[node].push_back(layer);
    orders[node].push_back(layer);
  }
  if (!orphans.empty()) {
    std::sort(orphans.begin(), orphans.end());
    fail(self, ph, "layer(s) " + list(orphans) + " have no live holder left that could write them");
    return false;
  }
  for (auto& [node, ls] : orders) {
    const auto attempt = ++ck.attempts[node];
    const std::string writer =
        "node" + std::to_string(node.value) + ".req" + std::to_string(ck.request) + ".a" + std::to_string(attempt);
    self->delayed_send(caf::actor_cast<coordinator_actor>(self), write_deadline(st, ls), checkpoint_deadline{ck.request, node, attempt});
    self->send(st.nodes.at(node).monitor, write_checkpoint{ck.request, ck.step, ck.temp, std::move(ls), writer});
  }
  return true;
}

/// Gives up on `node` as a writer of this checkpoint (it failed or missed its deadline): its
/// unanswered layers go to other holders. False when the checkpoint failed (the phase was left).
bool replace_writer(coordinator_pointer self, phase::checkpointing& ph, node_id node, const std::string& why) {
  auto& ck = ph.progress;
  ck.failed.insert(node);
  auto again = std::move(ck.asked[node]);
  ck.asked.erase(node);
  if (again.empty()) return true;
  self->state.deps.log(to_string(node) + " " + why + " writing layer(s) " + list(again) + ": asking another holder");
  return ask(self, ph, again);
}

bool all_written(const checkpoint_progress& ck) {
  for (const auto& [node, layers] : ck.asked)
    if (!layers.empty()) return false;
  return static_cast<std::int32_t>(ck.files.size()) == ck.num_layers;
}

/// The checkpoint of request `request` was finished (`dir`) or failed (`error`).
void finished(coordinator_pointer self, std::uint64_t request, std::uint64_t step,
              const std::optional<std::string>& dir, const std::string& error) {
  auto& st = self->state;
  auto* ph = current(self, request);
  if (!ph) {
    // Abandoned (a reconfiguration) while it was finished: a complete checkpoint still counts.
    if (dir) {
      st.last_checkpoint = *dir;
      st.deps.log("checkpoint of step " + std::to_string(step) + " written to " + *dir +
                  " (finished after it was abandoned)");
      publish(self, {event_kind::checkpoint_written, st.epoch, step, -1, 0, *dir});
    }
    return;
  }
  if (!dir) return fail(self, *ph, error);
  const auto progress = std::move(ph->progress);
  st.last_checkpoint = *dir;
  std::uint64_t bytes = 0;
  for (const auto& f : progress.files) bytes += f.bytes;
  const double ms = std::chrono::duration<double, std::milli>(st.deps.now() - progress.started).count();
  publish(self, {event_kind::checkpoint_written, st.epoch, progress.step, -1, 0, *dir});
  if (progress.stop_after) return finish_stop(self, progress.outcome, progress.reason, *dir, {});
  st.deps.log("checkpoint of step " + std::to_string(progress.step) + " written to " + *dir + " (" +
              std::to_string(progress.files.size()) + " layer files, " + std::to_string(bytes) + " bytes, " +
              std::to_string(static_cast<long long>(ms)) + " ms)");
  after_commit(self);
}

/// Every layer written: the manifest, the hashes, the rename, off the coordinator's thread; then
/// the stop or the next step. The phase stays checkpointing meanwhile.
void complete(coordinator_pointer self, phase::checkpointing& ph) {
  auto& ck = ph.progress;
  ck.finishing = true;
  auto finish = self->state.deps.checkpoint.finish;
  const auto request = ck.request;
  const auto step = ck.step;
  run_io(
      self, [finish, temp = ck.temp, step, files = ck.files] { return finish(temp, step, files); },
      [self, request, step](std::optional<std::string> dir, const std::string& error) {
        finished(self, request, step, dir, error);
      });
}

/// The temporary directory of checkpoint `request` exists (`temp`), or could not be made.
void begun(coordinator_pointer self, std::uint64_t request, const std::optional<std::string>& temp,
           const std::string& error) {
  auto& st = self->state;
  auto* ph = current(self, request);
  if (!ph) {  // abandoned meanwhile
    if (temp) discard_later(self, *temp);
    return;
  }
  if (!temp) return fail(self, *ph, error);
  ph->progress.temp = *temp;
  std::vector<layer_index> all;
  for (std::int32_t l = 0; l < ph->progress.num_layers; ++l) all.push_back(layer_index{l});
  st.deps.log(std::string(ph->progress.stop_after ? "writing a checkpoint of step " : "periodic checkpoint of step ") +
              std::to_string(ph->progress.step) + " (" + std::to_string(all.size()) + " layers) to " +
              st.deps.checkpoint.root);
  ask(self, *ph, all);
}

/// Starts writing a checkpoint of the committed state (step st.step) by the surviving holders.
void start(coordinator_pointer self, bool stop_after, stop_outcome outcome, const std::string& reason) {
  auto& st = self->state;
  checkpoint_progress ck;
  ck.request = ++st.checkpoint_requests;
  ck.step = st.step;
  ck.started = st.deps.now();
  ck.stop_after = stop_after;
  ck.outcome = outcome;
  ck.reason = reason;
  std::map<layer_index, std::vector<node_id>> holders;
  try {
    holders = surviving_holders(st, ck.num_layers);
  } catch (const std::exception& e) {
    if (stop_after)
      return finish_stop(self, outcome, reason, std::nullopt, std::string("no configuration to write from: ") + e.what());
    st.deps.log(std::string("checkpoint skipped: ") + e.what());
    return after_commit(self);
  }
  std::vector<layer_index> orphans;
  for (const auto& [layer, nodes] : holders)
    if (nodes.empty()) orphans.push_back(layer);
  if (!orphans.empty()) {
    const std::string why = "layer(s) " + list(orphans) + " have no surviving holder";
    if (stop_after) return finish_stop(self, outcome, reason, std::nullopt, why);
    st.deps.log("checkpoint skipped: " + why);
    return after_commit(self);
  }
  ck.candidates = std::move(holders);
  const auto request = ck.request;
  enter(self, phase::checkpointing{std::move(ck)});
  auto begin = st.deps.checkpoint.begin;
  const auto step = st.step;
  run_io(
      self, [begin, step] { return begin(step); },
      [self, request](std::optional<std::string> temp, const std::string& error) { begun(self, request, temp, error); });
}

}  // namespace

bool maybe_periodic_checkpoint(coordinator_pointer self) {
  auto& st = self->state;
  const auto& ck = st.deps.checkpoint;
  if (ck.every == 0 || ck.root.empty() || st.step == 0 || st.step % ck.every != 0) return false;
  start(self, false, stop_outcome::none, {});
  return true;
}

void checkpoint_and_stop(coordinator_pointer self, const std::string& reason) {
  self->state.deps.log("the reconfiguration policy says checkpoint and stop: " + reason);
  stop_after_checkpoint(self, stop_outcome::checkpoint_and_stop, reason);
}

void stop_after_checkpoint(coordinator_pointer self, stop_outcome outcome, const std::string& reason) {
  auto& st = self->state;
  if (std::holds_alternative<phase::stopped>(st.phase)) return;
  // A periodic checkpoint abandoned for the loss that led here is no longer written: a fresh one
  // is (below). Waiting for it instead waited for a writer that was gone, into a directory being
  // discarded.
  if (auto* ph = std::get_if<phase::checkpointing>(&st.phase); ph && !ph->progress.abandoned) {
    auto& ck = ph->progress;
    if (ck.stop_after) {
      st.deps.log("already writing a checkpoint before stopping (" + ck.reason + "); then it stops");
      return;
    }
    // A periodic checkpoint of the committed state is being written: it is the one.
    ck.stop_after = true;
    ck.outcome = outcome;
    ck.reason = reason;
    st.deps.log("stopping after the checkpoint of step " + std::to_string(ck.step) + " being written: " + reason);
    return;
  }
  if (st.deps.checkpoint.root.empty())
    return finish_stop(self, outcome, reason, std::nullopt,
                       "no checkpoint directory is configured (--checkpoint-dir, or [checkpoint] dir in the job file)");
  if (!st.formed_once) {
    if (outcome == stop_outcome::checkpoint_and_stop)
      return finish_stop(self, outcome, reason, std::nullopt, "no epoch has formed yet: there is no trained state to write");
    // Nothing trained by this run (a resumed one's state is still its checkpoint).
    st.deps.log("no checkpoint written before stopping: no epoch has formed yet, nothing was trained");
    return stop_job(self, outcome, reason);
  }
  // A commit sent to every node stands (each applies it before it writes); a step or an epoch in
  // progress is abandoned, so that no stage waits on a peer while it should write.
  commit_stands_if_decided(self, std::nullopt);
  if (std::holds_alternative<phase::training>(st.phase) || std::holds_alternative<phase::forming>(st.phase))
    for (node_id id : st.current.nodes) {
      const auto& n = st.nodes.at(id);
      if (n.state != node_state::lost) self->send(n.monitor, abort_epoch{st.epoch, "stopping: " + reason});
    }
  start(self, true, outcome, reason);
}

void on_checkpoint_deadline(coordinator_pointer self, const checkpoint_deadline& d) {
  auto& st = self->state;
  // Its own timers only: a deadline from anyone else would let a stranger fail a writer.
  if (self->current_sender() != self->ctrl()) return void(++st.dropped);
  auto* ph = current(self, d.request);
  if (!ph || ph->progress.finishing) return;
  auto& ck = ph->progress;
  if (ck.attempts[d.node] != d.attempt || ck.asked[d.node].empty()) return;  // answered, or asked again since
  if (!replace_writer(self, *ph, d.node, "did not answer within its deadline")) return;
  if (all_written(ph->progress)) complete(self, *ph);
}

bool handle(coordinator_pointer self, phase::checkpointing& ph, checkpoint_written& w) {
  auto& st = self->state;
  auto& ck = ph.progress;
  if (w.request != ck.request) return false;
  if (ck.finishing) return true;  // late: every layer is written already
  auto& asked = ck.asked[w.node];
  for (const auto& f : w.files) {
    // Only a layer asked of this node and not answered yet (a writer replaced after its deadline
    // may still answer: its layers are someone else's now).
    if (std::erase(asked, f.layer) == 0) continue;
    ck.files.push_back(f);
  }
  std::vector<layer_index> again;
  for (auto l : w.missing)
    if (std::erase(asked, l) > 0) again.push_back(l);
  if (!again.empty()) {
    st.deps.log(to_string(w.node) + " no longer holds layer(s) " + list(again) + ": asking another holder");
    if (!ask(self, ph, again)) return true;  // failed: the phase is gone
  }
  if (!w.error.empty() && !replace_writer(self, ph, w.node, "failed (" + w.error + ")")) return true;
  if (all_written(ck)) complete(self, ph);
  return true;
}

void fallback_writer_lost(coordinator_pointer self, phase::checkpointing& ph, node_id node) {
  auto& ck = ph.progress;
  if (ck.finishing) return;  // every layer is written already
  const auto it = ck.asked.find(node);
  if (it == ck.asked.end() || it->second.empty()) return;
  if (!replace_writer(self, ph, node, "was lost while")) return;
  if (all_written(ck)) complete(self, ph);
}

void abandon_periodic_checkpoint(coordinator_pointer self, phase::checkpointing& ph, const std::string& why) {
  auto& st = self->state;
  if (ph.progress.finishing) {
    // Every layer is written and the helper is finishing it: it completes on its own (finished()).
    st.deps.log("checkpoint of step " + std::to_string(ph.progress.step) + " is being finished; " + why);
    return;
  }
  discard_later(self, ph.progress.temp);  // empty while begin runs: begun() discards it
  ph.progress.abandoned = true;
  st.deps.log("checkpoint of step " + std::to_string(ph.progress.step) + " abandoned: " + why);
}

}  // namespace oobleck::actors
