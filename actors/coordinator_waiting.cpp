// Waiting for nodes below the minimum (ARCHITECTURE.md §10 "Waiting for nodes"). When the
// reconfiguration policy says "checkpoint and stop" (fewer than (f + 1) x n0 nodes left, or a
// layer without a surviving copy), a coordinator with deps.wait_below_minimum writes the checkpoint
// as before (when it has a folder) and then, instead of stopping, keeps the survivors with their
// layers, admits joining workers and resumes by itself once (f + 1) x n0 nodes are there: from the
// survivors' memory when the policy can go on from the last formed configuration (every layer
// kept a live holder), else from the checkpoint it wrote (or the newest before it), at that
// checkpoint's step. Either way the steps run with their own samples: the trajectory is the
// failure-free one. deps.wait_for_nodes_ms bounds the wait; then the job stops as it would have.

#include <algorithm>
#include <charconv>
#include <filesystem>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "actors/coordinator_training.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

void arm_wait_deadline(coordinator_pointer self, phase::waiting& ph) {
  const double ms = self->state.deps.wait_for_nodes_ms;
  if (ms <= 0) return;  // unlimited
  const auto delay = std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000));
  self->delayed_send(caf::actor_cast<coordinator_actor>(self), delay,
                     coordinator_deadline{deadline_kind::wait, 0, 0, ++ph.round});
}

/// (f + 1) x the smallest template's nodes: the fewest the policy goes on with.
std::int32_t nodes_needed(const coordinator_state& st) {
  const auto sizes = st.templates.sizes();
  const int n0 = sizes.empty() ? 1 : *std::min_element(sizes.begin(), sizes.end());
  return (st.deps.job.fault_tolerance + 1) * std::max(1, n0);
}

}  // namespace

bool every_layer_held(const coordinator_state& st) {
  if (!st.formed_once || st.formed.pipelines.empty()) return false;
  const auto ep = planning::map_epoch(st.templates, st.formed.pipelines, {});
  for (int l = 0; l < ep.num_layers(); ++l) {
    bool held = false;
    for (auto r : ep.holders(layer_index{l})) {
      const auto it = st.nodes.find(ep.node(r));
      held = held || (it != st.nodes.end() && it->second.state != node_state::lost);
    }
    if (!held) return false;
  }
  return true;
}

std::optional<std::uint64_t> checkpoint_step_of(const std::string& dir) {
  const std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
  constexpr std::string_view prefix = "step-";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  std::uint64_t step = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last || first == last) return std::nullopt;
  return step;
}

void resume_from_checkpoint(coordinator_pointer self, const std::string& dir, std::uint64_t step) {
  auto& st = self->state;
  st.deps.checkpoint.resume_dir = dir;
  st.deps.checkpoint.resume_step = step;
  st.last_checkpoint = dir;
  st.step = step;
  st.formed_once = false;
  st.formed = {};
  st.lost_since_formed.clear();
  st.failures_without_loss = 0;
  plan_first_epoch(self);
}

void note_formed_losses(coordinator_state& st) {
  auto note = [&](node_id id) {
    const auto it = st.nodes.find(id);
    if ((it == st.nodes.end() || it->second.state == node_state::lost) &&
        std::find(st.lost_since_formed.begin(), st.lost_since_formed.end(), id) == st.lost_since_formed.end())
      st.lost_since_formed.push_back(id);
  };
  for (const auto& p : st.formed.pipelines)
    for (node_id id : p.nodes) note(id);
  for (node_id id : st.formed.idle_nodes) note(id);
}

namespace {

std::string seconds(double ms) { return std::to_string(static_cast<long long>(ms / 1000)) + " s"; }

/// Logs, publishes and records how many nodes there are.
void report(coordinator_pointer self, phase::waiting& ph) {
  auto& st = self->state;
  const std::string counts = "have " + std::to_string(ph.have) + ", need " + std::to_string(ph.need);
  st.deps.log("waiting for nodes: " + counts + " (" + ph.reason + ")");
  publish(self, {event_kind::waiting_for_nodes, st.epoch, st.step, -1, st.last_loss, counts + ": " + ph.reason});
  st.deps.on_waiting({ph.have, ph.need, st.step, ph.reason, ph.checkpoint});
}

void resumed(coordinator_pointer self, const phase::waiting& ph, const std::string& source, const std::string& dir,
             std::uint64_t step) {
  auto& st = self->state;
  const double waited = ms_between(ph.started, st.deps.now());
  st.deps.log("enough nodes again (" + std::to_string(ph.have) + " of " + std::to_string(ph.need) + " needed) after " +
              seconds(waited) + ": resuming at step " + std::to_string(step) + " from " +
              (dir.empty() ? source : source + " " + dir));
  publish(self, {event_kind::resumed, st.epoch, step, -1, st.last_loss, dir.empty() ? source : source + " " + dir});
  st.deps.on_resumed({source, dir, step, ph.have, waited});
}

/// Ends the wait without resuming: the job stops as "checkpoint and stop" would have.
void give_up(coordinator_pointer self, phase::waiting& ph, const std::string& why) {
  auto& st = self->state;
  checkpoint_stop_record rec{ph.reason, ph.written, ph.written ? std::nullopt : ph.checkpoint, st.step};
  if (ph.checkpoint) st.deps.log("resume with: " + st.deps.checkpoint.resume_command(*ph.checkpoint));
  st.deps.checkpoint.on_stop(rec);
  stop_job(self, stop_outcome::checkpoint_and_stop, "checkpoint and stop: " + ph.reason + " (" + why + ")");
}

}  // namespace

bool wait_for_nodes(coordinator_pointer self, const checkpoint_stop_record& rec) {
  auto& st = self->state;
  if (!st.deps.wait_below_minimum) return false;
  std::optional<std::string> checkpoint = rec.dir ? rec.dir : rec.latest;
  std::uint64_t checkpoint_step = st.step;
  if (checkpoint && !rec.dir) {
    if (const auto s = checkpoint_step_of(*checkpoint)) {
      checkpoint_step = *s;
    } else {
      st.deps.log("cannot tell the step of " + *checkpoint + ": not resuming from it");
      checkpoint.reset();
    }
  }
  if (!every_layer_held(st) && !checkpoint) {
    st.deps.log("not waiting for nodes: no node holds every layer's committed state and there is no checkpoint");
    return false;
  }
  phase::waiting next;
  next.have = live_count_of(st);
  next.need = nodes_needed(st);
  next.reason = rec.reason;
  next.checkpoint = checkpoint;
  next.checkpoint_step = checkpoint_step;
  next.written = rec.dir;
  next.started = st.deps.now();
  auto& ph = enter(self, std::move(next));
  st.deps.log(std::string("below the minimum: the survivors keep their layers and the job waits for nodes") +
              (st.deps.wait_for_nodes_ms > 0 ? " (at most " + seconds(st.deps.wait_for_nodes_ms) + ")" : "") +
              "; it resumes by itself once " + std::to_string(ph.need) + " node(s) are there");
  arm_wait_deadline(self, ph);
  report(self, ph);
  waiting_changed(self, ph);
  return true;
}

void waiting_changed(coordinator_pointer self, phase::waiting& ph) {
  auto& st = self->state;
  const std::int32_t have = live_count_of(st);
  const bool changed = have != ph.have;
  ph.have = have;
  if (have < ph.need) {
    if (!every_layer_held(st) && !ph.checkpoint)
      return give_up(self, ph, "a layer lost its last holder while waiting, and there is no checkpoint");
    if (changed) report(self, ph);
    return;
  }
  // Enough nodes. From memory when the policy goes on from the last formed configuration.
  if (st.formed_once) {
    note_formed_losses(st);
    const auto r = reconfigure_now(st);
    if (r.action == planning::reconfiguration_action::continue_training) {
      resumed(self, ph, "memory", {}, st.step);
      return enter_forming(self, std::nullopt);
    }
    st.deps.log("the nodes' memory cannot continue the job: " + r.reason);
  }
  if (!ph.checkpoint) {
    if (changed) report(self, ph);
    return;
  }
  // From the checkpoint: the job's first epoch again, its layers installed from the checkpoint.
  const std::string dir = *ph.checkpoint;
  const std::uint64_t step = ph.checkpoint_step;
  resumed(self, ph, "checkpoint", dir, step);
  resume_from_checkpoint(self, dir, step);
}

void waiting_lost(coordinator_pointer self, phase::waiting& ph, node_id) {
  note_formed_losses(self->state);
  waiting_changed(self, ph);
}

void resume_or_wait_from_checkpoint(coordinator_pointer self, const std::string& dir, std::uint64_t step,
                                    const std::string& reason) {
  auto& st = self->state;
  if (st.templates.templates.empty()) {
    // A replacement coordinator has not planned yet: the job's templates tell its minimum.
    planning::job_config job = st.deps.job;
    job.nodes = st.deps.expected_nodes;
    try {
      st.templates = planning::plan_job(st.deps.profile, job).templates;
    } catch (const std::exception& e) {
      st.deps.log(std::string("cannot plan the job's templates: ") + e.what());
    }
  }
  st.formed_once = false;
  st.formed = {};
  st.lost_since_formed.clear();
  const std::int32_t need = nodes_needed(st);
  if (!st.deps.wait_below_minimum || live_count_of(st) >= need) return resume_from_checkpoint(self, dir, step);
  phase::waiting next;
  next.have = live_count_of(st);
  next.need = need;
  next.reason = reason;
  next.checkpoint = dir;
  next.checkpoint_step = step;
  next.started = st.deps.now();
  auto& ph = enter(self, std::move(next));
  arm_wait_deadline(self, ph);
  report(self, ph);
}

bool handle(coordinator_pointer self, phase::waiting& ph, coordinator_deadline& d) {
  if (d.kind != deadline_kind::wait || d.probe != ph.round) return false;
  auto& st = self->state;
  give_up(self, ph,
          "waited " + seconds(st.deps.wait_for_nodes_ms) + " for nodes: have " + std::to_string(live_count_of(st)) +
              ", need " + std::to_string(ph.need));
  return true;
}

}  // namespace oobleck::actors
