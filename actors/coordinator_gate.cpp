#include "actors/coordinator_gate.hpp"

#include <algorithm>
#include <set>
#include <variant>
#include <vector>

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

gate_verdict refused(std::string why) { return {gate_verdict::refuse, std::move(why)}; }

std::string sender_name(const caf::strong_actor_ptr& sender) {
  return sender ? "actor " + caf::to_string(sender) : std::string("an anonymous sender");
}

/// The sender must be the monitor admitted for `node`; a lost node's is fenced.
gate_verdict from_monitor(coordinator_pointer self, node_id node) {
  const auto& st = self->state;
  const auto it = st.nodes.find(node);
  if (it == st.nodes.end()) return refused("it names " + to_string(node) + ", which is not a node of this job");
  if (!sent_by(self->current_sender(), it->second.monitor.address()))
    return refused("it names " + to_string(node) + " but was not sent by that node's monitor");
  if (it->second.state == node_state::lost) return {gate_verdict::fence, {}};
  return {};
}

/// Layers of the job's model, unique: "" or what is wrong.
std::string check_layers(const coordinator_state& st, const std::vector<layer_index>& layers, const char* what) {
  const int count = st.deps.profile.num_layers();
  if (layers.size() > static_cast<std::size_t>(count))
    return std::to_string(layers.size()) + " " + what + " for a model of " + std::to_string(count) + " layers";
  std::vector<bool> seen(static_cast<std::size_t>(count), false);
  for (auto l : layers) {
    if (l.value < 0 || l.value >= count)
      return std::string(what) + " " + std::to_string(l.value) + " is not a layer of the model (0.." +
             std::to_string(count - 1) + ")";
    if (seen[static_cast<std::size_t>(l.value)]) return std::string(what) + " " + std::to_string(l.value) + " twice";
    seen[static_cast<std::size_t>(l.value)] = true;
  }
  return {};
}

constexpr std::size_t max_text = 4096;  ///< of a node's free text (an error, a fault): longer is cut

void cut(std::string& text) {
  if (text.size() > max_text) text.resize(max_text);
}

bool power_of_ten(std::uint64_t n) {
  while (n >= 10 && n % 10 == 0) n /= 10;
  return n == 1;
}

}  // namespace

bool sent_by(const caf::strong_actor_ptr& sender, const caf::actor_addr& who) {
  return sender && who && sender->address() == who;
}

gate_verdict gate(coordinator_pointer self, node_ready& m) {
  if (auto v = from_monitor(self, m.node); v.kind != gate_verdict::accept) return v;
  const auto& st = self->state;
  // Its stage handles are checked against the epoch in force; a node_ready of another epoch is
  // dropped by the phase.
  if (m.epoch != st.epoch || !std::holds_alternative<phase::forming>(st.phase)) return {};
  if (!st.current.contains(m.node)) return refused(to_string(m.node) + " is not in epoch " + std::to_string(st.epoch));
  std::size_t assigned = 0;
  for (const auto& pipeline : st.current.stages)
    for (const auto& [node, index] : pipeline)
      if (node == m.node) ++assigned;
  if (m.stages.size() != assigned)
    return refused("it reports " + std::to_string(m.stages.size()) + " stage(s); epoch " + std::to_string(st.epoch) +
                   " gave " + to_string(m.node) + " " + std::to_string(assigned));
  const auto process = st.nodes.at(m.node).monitor->node();
  for (const auto& stage : m.stages)
    if (!stage || stage->node() != process) return refused("a stage handle that is not of the node's own process");
  return {};
}

gate_verdict gate(coordinator_pointer self, node_fault& m) {
  cut(m.what);
  if (auto v = from_monitor(self, m.node); v.kind != gate_verdict::accept) return v;
  // Epochs start at 1: no stage ran in epoch 0, so no failure of one can be reported (a fault of
  // epoch 0 counted as a strike before the first commit).
  if (m.epoch == 0) return refused("a fault of epoch 0, in which no stage runs");
  return {};
}

gate_verdict gate(coordinator_pointer self, epoch_aborted& m) { return from_monitor(self, m.node); }

gate_verdict gate(coordinator_pointer self, stall_report& m) { return from_monitor(self, m.node); }

gate_verdict gate(coordinator_pointer self, step_committed& m) {
  if (auto v = from_monitor(self, m.node); v.kind != gate_verdict::accept) return v;
  std::vector<layer_index> layers;
  for (const auto& d : m.digests) layers.push_back(d.layer);
  if (auto bad = check_layers(self->state, layers, "digest(s) of layer"); !bad.empty()) return refused(bad);
  // At most the two tied layers (0 and the last), each once, and each also among the digests.
  if (m.tied_digests.size() > 2) return refused("more than two tied-embedding digests");
  for (const auto& d : m.tied_digests) {
    const int last = self->state.deps.profile.num_layers() - 1;
    if (d.layer.value != 0 && d.layer.value != last) return refused("a tied-embedding digest of a layer that is not tied");
    if (std::find(layers.begin(), layers.end(), d.layer) == layers.end())
      return refused("a tied-embedding digest of a layer the node did not commit");
  }
  if (m.tied_digests.size() == 2 && m.tied_digests[0].layer == m.tied_digests[1].layer)
    return refused("two tied-embedding digests of one layer");
  return {};
}

gate_verdict gate(coordinator_pointer self, checkpoint_written& m) {
  if (auto v = from_monitor(self, m.node); v.kind != gate_verdict::accept) return v;
  cut(m.error);
  std::vector<layer_index> files;
  for (const auto& f : m.files) {
    if (f.sha256.empty() || f.sha256.size() > 64) return refused("a layer file's checksum is empty or longer than a SHA-256's");
    files.push_back(f.layer);
  }
  if (auto bad = check_layers(self->state, files, "file(s) of layer"); !bad.empty()) return refused(bad);
  if (auto bad = check_layers(self->state, m.missing, "missing layer(s)"); !bad.empty()) return refused(bad);
  return {};
}

gate_verdict gate(coordinator_pointer self, pipeline_done& m) {
  const auto& st = self->state;
  cut(m.error);
  // The pipeline actors of earlier epochs are gone from the coordinator's books: a report of
  // another epoch cannot be told from a forgery, and is dropped either way.
  if (m.epoch != st.epoch) return {gate_verdict::fence, {}};
  if (m.pipeline < 0 || static_cast<std::size_t>(m.pipeline) >= st.current.pipelines.size())
    return refused("pipeline " + std::to_string(m.pipeline) + " is not a pipeline of epoch " + std::to_string(st.epoch));
  const auto& actor = st.current.pipelines[static_cast<std::size_t>(m.pipeline)].actor;
  if (!actor || !sent_by(self->current_sender(), actor.address()))
    return refused("it names pipeline " + std::to_string(m.pipeline) + " but was not sent by its pipeline actor");
  return {};
}

/// The coordinator's own timers: from anyone else a deadline would let a stranger fail a step.
gate_verdict from_self(coordinator_pointer self) {
  if (self->current_sender() != self->ctrl()) return refused("a deadline the coordinator did not set");
  return {};
}
gate_verdict gate(coordinator_pointer self, coordinator_deadline&) { return from_self(self); }

/// Drops and counts a refused message; logs it with its sender at that sender's 1st, 10th, 100th...
void refuse_message(coordinator_pointer self, const char* what, const std::string& why) {
  auto& st = self->state;
  ++st.dropped;
  ++st.refused_messages;
  std::string who = sender_name(self->current_sender());
  std::uint64_t count = 0;
  if (auto it = st.refused_by_sender.find(who); it != st.refused_by_sender.end()) {
    count = ++it->second;
  } else if (st.refused_by_sender.size() < coordinator_state::refusal_senders_named) {
    count = st.refused_by_sender[who] = 1;
  } else {
    count = ++st.refused_from_others;
    who = "one of " + std::to_string(st.refused_by_sender.size()) + "+ senders (no longer named one by one)";
  }
  if (!power_of_ten(count)) return;
  st.deps.log("refused " + std::string(what) + " from " + who + ": " + why +
              (count > 1 ? " (" + std::to_string(count) + " refused from it so far)" : ""));
}

/// An exception out of a handler: valid input never causes one (the gate checked it), so it is the
/// coordinator's bug: logged with BUG and the sender, reported through on_bug, and the job goes on.
void handler_threw(coordinator_pointer self, const char* what, const char* error) {
  auto& st = self->state;
  const std::string line = std::string("handling ") + what + " from " + sender_name(self->current_sender()) +
                           " threw: " + error;
  st.deps.log("BUG: " + line);
  st.deps.on_bug(line);
}

/// Lost nodes stay in the registry for status, but not forever: beyond the newest
/// lost_entries_kept, the oldest are forgotten, except those the job still refers to (the epoch in
/// force, the last formed configuration, a checkpoint or phase in progress), so every lookup of a
/// node id the job holds finds its entry.
void forget_old_losses(coordinator_state& st) {
  if (st.nodes.size() <= coordinator_state::lost_entries_kept) return;
  // Nodes declared lost without a down message (evicted) join the order when first seen here.
  const std::set<node_id> known(st.lost_order.begin(), st.lost_order.end());
  for (const auto& [id, n] : st.nodes)
    if (n.state == node_state::lost && !known.count(id)) st.lost_order.push_back(id);
  if (st.lost_order.size() <= coordinator_state::lost_entries_kept) return;
  std::set<node_id> held(st.current.nodes.begin(), st.current.nodes.end());
  for (const auto& p : st.formed.pipelines) held.insert(p.nodes.begin(), p.nodes.end());
  held.insert(st.formed.idle_nodes.begin(), st.formed.idle_nodes.end());
  held.insert(st.lost_since_formed.begin(), st.lost_since_formed.end());
  held.insert(st.joining.begin(), st.joining.end());
  std::visit(overloaded{
                 [&](const phase::forming& ph) {
                   for (const auto& [id, stages] : ph.ready) held.insert(id);
                 },
                 [&](const phase::committing& ph) { held.insert(ph.pending.begin(), ph.pending.end()); },
                 [&](const phase::checkpointing& ph) {
                   for (const auto& [layer, nodes] : ph.progress.candidates) held.insert(nodes.begin(), nodes.end());
                   for (const auto& [id, layers] : ph.progress.asked) held.insert(id);
                 },
                 [](const auto&) {},
             },
             st.phase);
  for (auto it = st.lost_order.begin();
       it != st.lost_order.end() && st.lost_order.size() > coordinator_state::lost_entries_kept;) {
    if (held.count(*it)) {
      ++it;
      continue;
    }
    st.nodes.erase(*it);
    it = st.lost_order.erase(it);
  }
}

/// Who asked for a nonce, for the nonce book's per-owner bound: a remote process (all the actors
/// behind one connection are one owner), or a local actor.
std::string nonce_owner(coordinator_pointer self) {
  const auto& sender = self->current_sender();
  if (!sender) return "anonymous";
  if (sender->node() != self->node()) return "node " + caf::to_string(sender->node());
  return "actor " + std::to_string(sender->id());
}

}  // namespace oobleck::actors
