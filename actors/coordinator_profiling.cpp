// Profile at job start (ARCHITECTURE.md §4 "Profile at job start"): a job without a profile file
// is measured on one of its own nodes before its first plan, so the plan, and the step time it
// predicts, come from this cluster's numbers rather than a model of them.
//
//   registering --(every expected node admitted)--> profiling --(the profile)--> forming
//        ^                                              |
//        +------------(a node lost: too few)------------+   (the node asked lost: another is asked)

#include <chrono>
#include <string>

#include "actors/coordinator_training.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// The node's answer to request `round`: accepted (and kept), the first epoch planned from it
/// when every expected node is still there; an error stops the job, saying why.
void on_profile(coordinator_pointer self, std::uint64_t round, node_id node, const std::string& text) {
  auto& st = self->state;
  if (round != st.profile_round || !st.deps.profile_at_start) return;  // stale: another node was asked since
  const auto* ph = std::get_if<phase::profiling>(&st.phase);
  const double seconds = ph ? ms_between(ph->started, st.deps.now()) / 1000.0 : 0;
  try {
    st.deps.profile = st.deps.accept_profile ? st.deps.accept_profile(text) : st.deps.profile;
  } catch (const std::exception& e) {
    return stop_job(self, stop_outcome::failed,
                    "the profile " + to_string(node) + " measured cannot be used: " + std::string(e.what()));
  }
  st.deps.profile_at_start = false;
  st.deps.log("profiled the job's model on " + to_string(node) + " in " + std::to_string(seconds) + " s (" +
              std::to_string(st.deps.profile.num_layers()) + " layers, device " +
              (st.deps.profile.device_kind.empty() ? std::string("unknown") : st.deps.profile.device_kind) + ")");
  st.deps.on_profiled(st.deps.profile);
  if (ph) plan_first_epoch(self);  // else (a node was lost meanwhile) the first plan waits for its nodes
}

void on_profile_error(coordinator_pointer self, std::uint64_t round, node_id node, const caf::error& err) {
  auto& st = self->state;
  if (round != st.profile_round || !st.deps.profile_at_start) return;
  const auto it = st.nodes.find(node);
  if (it == st.nodes.end() || it->second.state == node_state::lost) return;  // its loss asks another (profiling_lost)
  // The node went away before it answered: its loss (the down message on its way) asks another.
  if (err == caf::sec::request_receiver_down) return;
  if (err == caf::sec::request_timeout)
    return stop_job(self, stop_outcome::failed,
                    "profiling the job's model on " + to_string(node) + " took longer than " +
                        std::to_string(static_cast<long long>(st.deps.profile_deadline_ms / 1000)) +
                        " s (give a measured profile with --profile or [profile] file; oobleck-profile writes one)");
  stop_job(self, stop_outcome::failed,
           "profiling the job's model on " + to_string(node) + " failed: " + describe(err) +
               " (give a measured profile with --profile or [profile] file; oobleck-profile writes one)");
}

}  // namespace

void start_profiling(coordinator_pointer self) {
  auto& st = self->state;
  std::optional<node_id> chosen;
  for (const auto& [id, n] : st.nodes)
    if (n.state != node_state::lost) {
      chosen = id;
      break;
    }
  if (!chosen) return;  // update_admission saw enough live nodes: not reached
  phase::profiling next;
  next.node = *chosen;
  next.started = st.deps.now();
  enter(self, std::move(next));
  const std::uint64_t round = ++st.profile_round;
  const node_id node = *chosen;
  st.deps.log("no profile for this job: " + to_string(node) + " (" + st.nodes.at(node).name +
              ") measures its model before the first plan");
  self->request(st.nodes.at(node).monitor,
                std::chrono::milliseconds(static_cast<std::int64_t>(st.deps.profile_deadline_ms)), profile_atom_v)
      .then([self, round, node](std::string& text) { on_profile(self, round, node, text); },
            [self, round, node](caf::error& err) { on_profile_error(self, round, node, err); });
}

void profiling_lost(coordinator_pointer self, phase::profiling& ph, node_id node) {
  auto& st = self->state;
  const bool asked = ph.node == node;
  if (live_count_of(st) < st.deps.expected_nodes) {
    ++st.profile_round;  // its answer, if one comes, is not waited for: asked again when the nodes are back
    enter(self, phase::registering{});
    st.deps.log("waiting for nodes: " + std::to_string(live_count_of(st)) + " of " +
                std::to_string(st.deps.expected_nodes) + " admitted");
    return;
  }
  if (asked) start_profiling(self);  // profiling -> profiling, on another node
}

}  // namespace oobleck::actors
