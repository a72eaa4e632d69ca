#include "planning/reconfiguration.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "planning/batch_distribution.hpp"
#include "planning/instantiation.hpp"
#include "planning/node_spec.hpp"

namespace oobleck::planning {

namespace {

using node_list = std::vector<node_id>;

struct draft {
  node_list nodes;  // in stage order
};

int smallest_size(const template_set& t) { return t.templates.front().nodes; }
int largest_size(const template_set& t) { return t.templates.back().nodes; }

/// Layers [u, v) each node holds in a configuration.
using holding_map = std::map<node_id, std::pair<layer_index, layer_index>>;

/// Precondition: inconsistency() found nothing, so every pipeline has its template.
holding_map holdings(const template_set& templates, const std::vector<pipeline_instance>& ps) {
  holding_map out;
  for (const auto& p : ps) {
    const auto* t = templates.find(p.template_nodes);
    if (!t) continue;
    for (int i = 0; i < static_cast<int>(p.nodes.size()); ++i) out[p.nodes[i]] = t->node_layers(i);
  }
  return out;
}

/// What makes a configuration unreadable (a pipeline on a template the job does not have, or on
/// another number of nodes than its template; a node in two places); empty when it is sound.
std::string inconsistency(const template_set& templates, const cluster_state& state) {
  std::set<node_id> seen;
  auto twice = [&](node_id n) { return !seen.insert(n).second; };
  for (std::size_t i = 0; i < state.pipelines.size(); ++i) {
    const auto& p = state.pipelines[i];
    const std::string which = "pipeline " + std::to_string(i);
    if (!templates.find(p.template_nodes))
      return which + " runs a template of " + std::to_string(p.template_nodes) + " nodes, which the job does not have";
    if (static_cast<int>(p.nodes.size()) != p.template_nodes)
      return which + " has " + std::to_string(p.nodes.size()) + " nodes for a template of " +
             std::to_string(p.template_nodes);
    for (node_id n : p.nodes)
      if (twice(n)) return to_string(n) + " is in two places";
  }
  for (node_id n : state.idle_nodes)
    if (twice(n)) return to_string(n) + " is in two places";
  return {};
}

/// Rules (1)-(4). Returns the drafts; `rules` says which applied.
std::vector<draft> apply_rules(const template_set& templates, std::vector<node_list> groups,
                               const std::vector<bool>& shrank, node_list pool, int max_pipelines,
                               std::vector<reconfiguration_rule>& rules) {
  const int n0 = smallest_size(templates);
  const int n_max = largest_size(templates);
  auto has = [&](int n) { return templates.find(n) != nullptr; };
  std::vector<draft> kept;
  std::vector<node_list> needy;
  // (1) simple: keep every group that still has a template; trim to the largest size that has one.
  bool simple = false;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    auto& g = groups[i];
    int size = static_cast<int>(g.size());
    while (size >= n0 && !has(size)) --size;
    if (size >= n0) {
      simple = simple || shrank[i];
      pool.insert(pool.end(), g.begin() + size, g.end());
      g.resize(size);
      kept.push_back({std::move(g)});
    } else {
      needy.push_back(std::move(g));
    }
  }
  if (simple) rules.push_back(reconfiguration_rule::simple);
  // (2) borrow: fill needy pipelines up to n0 from free nodes, then from pipelines that can spare.
  std::sort(needy.begin(), needy.end(), [](const node_list& a, const node_list& b) { return a.size() > b.size(); });
  std::vector<node_list> still_needy;
  for (auto& g : needy) {
    while (static_cast<int>(g.size()) < n0 && !pool.empty()) {
      g.push_back(pool.front());
      pool.erase(pool.begin());
    }
    while (static_cast<int>(g.size()) < n0) {
      // Largest donor that stays on a template after giving one node.
      draft* donor = nullptr;
      for (auto& k : kept) {
        const int s = static_cast<int>(k.nodes.size());
        if (s > n0 && has(s - 1) && (!donor || s > static_cast<int>(donor->nodes.size()))) donor = &k;
      }
      if (!donor) break;
      g.push_back(donor->nodes.back());
      donor->nodes.pop_back();
    }
    if (static_cast<int>(g.size()) >= n0 && has(static_cast<int>(g.size()))) {
      rules.push_back(reconfiguration_rule::borrow);
      kept.push_back({std::move(g)});
    } else {
      still_needy.push_back(std::move(g));
    }
  }
  // (3) merge: what could not borrow pools its nodes, grouped by old pipeline.
  if (!still_needy.empty()) {
    rules.push_back(reconfiguration_rule::merge);
    node_list merged;
    for (auto& g : still_needy) merged.insert(merged.end(), g.begin(), g.end());
    pool.insert(pool.begin(), merged.begin(), merged.end());
  }
  // (4) free nodes (joined, idle, merged) form new pipelines, then enlarge the smallest ones.
  const bool had_free = !pool.empty();
  while (static_cast<int>(pool.size()) >= n0 && static_cast<int>(kept.size()) < max_pipelines) {
    int size = std::min(static_cast<int>(pool.size()), n_max);
    // Leave either nothing or enough for another pipeline; leftovers below n0 enlarge others.
    while (size > n0 && !has(size)) --size;
    if (!has(size)) break;
    kept.push_back({node_list(pool.begin(), pool.begin() + size)});
    pool.erase(pool.begin(), pool.begin() + size);
  }
  while (!pool.empty()) {
    draft* target = nullptr;
    for (auto& k : kept) {
      const int s = static_cast<int>(k.nodes.size());
      if (has(s + 1) && (!target || s < static_cast<int>(target->nodes.size()))) target = &k;
    }
    if (!target) break;
    target->nodes.push_back(pool.front());
    pool.erase(pool.begin());
  }
  if (had_free && (rules.empty() || rules.back() != reconfiguration_rule::merge))
    rules.push_back(reconfiguration_rule::join);
  if (rules.empty()) rules.push_back(reconfiguration_rule::unchanged);  // e.g. only idle nodes were lost
  return kept;  // nodes left in the pool stay idle unless the caller re-plans
}

/// Re-instantiates the whole cluster on `usable` nodes, keeping each old pipeline's survivors
/// together; nullopt if no instantiation exists (the caller checked that one does).
std::optional<std::vector<draft>> replan(const reconfiguration_context& ctx, std::vector<node_list> groups,
                                         node_list pool, int usable) {
  const auto inst = instantiate(ctx.templates.options(), usable, ctx.fault_tolerance + 1, ctx.num_microbatches);
  if (!inst) return std::nullopt;
  std::sort(groups.begin(), groups.end(), [](const node_list& a, const node_list& b) { return a.size() > b.size(); });
  std::vector<draft> out;
  std::size_t next_group = 0;
  for (int size : inst->template_nodes) {
    draft d;
    if (next_group < groups.size()) {
      auto& g = groups[next_group++];
      const std::size_t take = std::min<std::size_t>(size, g.size());
      d.nodes.assign(g.begin(), g.begin() + take);
      pool.insert(pool.end(), g.begin() + take, g.end());
    }
    out.push_back(std::move(d));
  }
  for (; next_group < groups.size(); ++next_group) pool.insert(pool.end(), groups[next_group].begin(), groups[next_group].end());
  std::size_t next_free = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    while (static_cast<int>(out[i].nodes.size()) < inst->template_nodes[i]) {
      if (next_free == pool.size()) return std::nullopt;  // more nodes planned than alive: cannot happen
      out[i].nodes.push_back(pool[next_free++]);
    }
  return out;
}

/// Surviving holders of each layer in the old configuration.
std::vector<std::vector<node_id>> surviving_holders(const holding_map& old_hold, const std::set<node_id>& lost,
                                                   int layers) {
  std::vector<std::vector<node_id>> holders(layers);
  for (const auto& [node, range] : old_hold)
    if (!lost.count(node))
      for (int l = range.first.value; l < range.second.value; ++l) holders[l].push_back(node);
  return holders;
}

std::vector<layer_copy> plan_copies(const reconfiguration_context& ctx, const holding_map& old_hold,
                                    const std::vector<std::vector<node_id>>& holders,
                                    const std::vector<pipeline_instance>& after) {
  std::map<node_id, std::int64_t> sent;  // bytes each source sends, to spread the load
  std::vector<layer_copy> copies;
  for (const auto& [node, range] : holdings(ctx.templates, after)) {
    auto it = old_hold.find(node);
    for (layer_index l = range.first; l < range.second; l = layer_index{l.value + 1}) {
      if (it != old_hold.end() && l >= it->second.first && l < it->second.second) continue;
      std::optional<node_id> source;
      for (node_id h : holders[static_cast<std::size_t>(l.value)])
        if (!source || sent[h] < sent[*source]) source = h;
      const auto bytes = layer_copy_bytes(ctx.costs, l);
      sent[*source] += bytes;  // every layer has a surviving holder: checked before (rule 5)
      copies.push_back({l, *source, node, bytes});
    }
  }
  return copies;
}

}  // namespace

std::int64_t layer_copy_bytes(const layer_costs& costs, layer_index layer) {
  // state_factor counts weights, gradients and optimizer moments; gradients are not copied.
  const double factor = std::max(1.0, costs.memory().state_factor - 1.0);
  return static_cast<std::int64_t>(
      std::llround(static_cast<double>(costs.param_bytes(layer, layer_index{layer.value + 1})) * factor));
}

const char* to_string(reconfiguration_action a) {
  return a == reconfiguration_action::continue_training ? "continue" : "checkpoint_and_stop";
}

const char* to_string(reconfiguration_rule r) {
  switch (r) {
    case reconfiguration_rule::unchanged: return "unchanged";
    case reconfiguration_rule::simple: return "simple";
    case reconfiguration_rule::borrow: return "borrow";
    case reconfiguration_rule::merge: return "merge";
    case reconfiguration_rule::join: return "join";
    case reconfiguration_rule::replan: return "replan";
  }
  return "?";
}

reconfiguration reconfigure(const reconfiguration_context& ctx, const cluster_state& current,
                            std::span<const node_id> lost_ids, std::span<const node_id> joined_ids) {
  reconfiguration out;
  auto stop = [&](std::string why) {
    out.action = reconfiguration_action::checkpoint_and_stop;
    out.reason = std::move(why);
    return out;
  };
  // Inputs no job produces: answered, never thrown or dereferenced blindly.
  if (ctx.templates.templates.empty()) return stop("the job has no pipeline templates");
  if (ctx.num_microbatches < ctx.fault_tolerance + 1)
    return stop(std::to_string(ctx.num_microbatches) + " microbatches per step cannot feed f + 1 = " +
                std::to_string(ctx.fault_tolerance + 1) + " pipelines");
  if (auto why = inconsistency(ctx.templates, current); !why.empty())
    return stop("the current configuration is inconsistent: " + why);

  // A loss reported for a node that is not in the configuration (reported twice) and a join of a
  // node that already is are no-ops.
  std::set<node_id> present(current.idle_nodes.begin(), current.idle_nodes.end());
  for (const auto& p : current.pipelines) present.insert(p.nodes.begin(), p.nodes.end());
  std::set<node_id> lost;
  for (node_id n : lost_ids)
    if (present.count(n)) lost.insert(n);
  node_list joined;
  for (node_id n : joined_ids)
    if (!present.count(n) && std::find(joined.begin(), joined.end(), n) == joined.end()) joined.push_back(n);

  std::vector<node_list> groups;
  std::vector<bool> shrank;
  int alive = 0;
  for (const auto& p : current.pipelines) {
    node_list g;
    for (node_id n : p.nodes)
      if (!lost.count(n)) g.push_back(n);
    alive += static_cast<int>(g.size());
    if (g.empty()) continue;
    shrank.push_back(g.size() < p.nodes.size());
    groups.push_back(std::move(g));
  }
  node_list pool;
  for (node_id n : current.idle_nodes)
    if (!lost.count(n)) pool.push_back(n);
  pool.insert(pool.end(), joined.begin(), joined.end());
  alive += static_cast<int>(pool.size());

  // (5) A layer none of whose holders survived cannot be recovered from a replica.
  const auto old_hold = holdings(ctx.templates, current.pipelines);
  const auto holders = surviving_holders(old_hold, lost, ctx.costs.num_layers());
  for (int l = 0; l < ctx.costs.num_layers(); ++l)
    if (holders[l].empty()) return stop("layer " + std::to_string(l) + " has no surviving copy");
  const int n0 = smallest_size(ctx.templates);
  const int need = (ctx.fault_tolerance + 1) * n0;
  if (alive < need)
    return stop(std::to_string(alive) + " nodes remain, fewer than (f + 1) * n0 = " + std::to_string(need));
  // The most nodes f + 1 to B/b pipelines can use; the rest stay idle (ARCHITECTURE.md §4).
  const int max_pipelines = std::min(ctx.num_microbatches, alive);
  const int usable =
      largest_covered_node_count(ctx.templates.sizes(), ctx.fault_tolerance + 1, max_pipelines, alive);
  if (usable == 0)  // (f + 1) pipelines of n0 nodes always fit here; kept so the function stays total
    return stop("no combination of " + std::to_string(ctx.fault_tolerance + 1) + " to " +
                std::to_string(max_pipelines) + " pipelines fits " + std::to_string(alive) + " nodes");

  const bool changed = !lost.empty() || !joined.empty();
  std::vector<draft> drafts;
  if (!changed && pool.empty()) {
    out.rules.push_back(reconfiguration_rule::unchanged);
    for (const auto& g : groups) drafts.push_back({g});
  } else {
    drafts = apply_rules(ctx.templates, groups, shrank, pool, max_pipelines, out.rules);
  }
  // The rules must give f + 1 to B/b pipelines that use as many nodes as any configuration could;
  // otherwise re-plan globally.
  int used = 0;
  for (const auto& d : drafts) used += static_cast<int>(d.nodes.size());
  const int count = static_cast<int>(drafts.size());
  if (count < ctx.fault_tolerance + 1 || count > max_pipelines || used != usable) {
    out.rules.assign(1, reconfiguration_rule::replan);
    auto planned = replan(ctx, groups, pool, usable);
    if (!planned) return stop("no instantiation of " + std::to_string(usable) + " nodes exists");
    drafts = std::move(*planned);
  }

  std::vector<pipeline_time> lines;
  std::set<node_id> in_use;
  for (const auto& d : drafts) {
    pipeline_instance p;
    p.nodes = d.nodes;
    p.template_nodes = static_cast<int>(d.nodes.size());
    lines.push_back(ctx.templates.find(p.template_nodes)->time);
    in_use.insert(d.nodes.begin(), d.nodes.end());
    out.pipelines.push_back(std::move(p));
  }
  const auto batch = distribute_batch(lines, ctx.num_microbatches, ctx.microbatch_size);
  for (std::size_t i = 0; i < out.pipelines.size(); ++i) {
    out.pipelines[i].microbatches = batch.microbatches[i];
    out.pipelines[i].time_ms = batch.time_ms[i];
  }
  out.step_ms = batch.step_ms + synchronisation_ms(ctx.costs, ctx.templates, out.pipelines);
  for (const auto& g : groups)
    for (node_id n : g)
      if (!in_use.count(n)) out.idle_nodes.push_back(n);
  for (node_id n : pool)
    if (!in_use.count(n)) out.idle_nodes.push_back(n);
  std::sort(out.idle_nodes.begin(), out.idle_nodes.end());
  out.copies = plan_copies(ctx, old_hold, holders, out.pipelines);
  std::string applied;
  for (auto r : out.rules) applied += (applied.empty() ? "" : "+") + std::string(to_string(r));
  out.reason = applied;
  return out;
}

}  // namespace oobleck::planning
