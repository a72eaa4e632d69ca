#include "planning/epoch.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace oobleck::planning {

namespace {

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("map_epoch: " + why); }

}  // namespace

std::optional<rank> epoch::rank_of(node_id n) const {
  // Ranks are few (one per node in use) and looked up at epoch start only.
  for (std::size_t r = 0; r < nodes_.size(); ++r)
    if (nodes_[r] == n) return rank{static_cast<int>(r)};
  return std::nullopt;
}

epoch map_epoch(const template_set& templates, std::span<const pipeline_instance> pipelines,
                std::span<const layer_copy> copies) {
  if (templates.templates.empty() || templates.templates.front().stages.empty()) refuse("no templates");
  const int num_layers = templates.templates.front().stages.back().end_layer.value;
  epoch e;
  std::map<node_id, rank> rank_of;
  auto add_rank = [&](node_id n) {
    const rank r{static_cast<int>(e.nodes_.size())};
    e.nodes_.push_back(n);
    e.stages_.emplace_back();
    rank_of.emplace(n, r);
    return r;
  };
  // Ranks in pipeline order, nodes in stage order.
  for (std::size_t p = 0; p < pipelines.size(); ++p) {
    const auto& pipe = pipelines[p];
    const auto* t = templates.find(pipe.template_nodes);
    if (!t || static_cast<int>(pipe.nodes.size()) != t->nodes)
      refuse("pipeline " + std::to_string(p) + " of " + std::to_string(pipe.nodes.size()) +
             " nodes has no template of that size");
    epoch_pipeline out;
    out.microbatches = pipe.microbatches;
    for (node_id id : pipe.nodes) {
      if (rank_of.count(id)) refuse(to_string(id) + " is in two pipelines");
      out.ranks.push_back(add_rank(id));
    }
    e.pipelines_.push_back(std::move(out));
  }
  // Stages: each knows its neighbours' ranks and its GPUs within the node.
  e.holders_.assign(num_layers, {});
  for (std::size_t p = 0; p < pipelines.size(); ++p) {
    const auto& t = *templates.find(pipelines[p].template_nodes);
    const auto& ranks = e.pipelines_[p].ranks;
    const int S = static_cast<int>(t.stages.size());
    int gpu = 0, node = -1;
    for (int k = 0; k < S; ++k) {
      const auto& spec = t.stages[k];
      if (spec.node != node) node = spec.node, gpu = 0;
      stage_assignment a;
      a.pipeline = static_cast<int>(p);
      a.stage = k;
      a.num_stages = S;
      a.first_layer = spec.first_layer;
      a.end_layer = spec.end_layer;
      a.first_gpu = gpu;
      a.gpus = spec.gpus;
      if (k > 0) a.prev = ranks[t.stages[k - 1].node];
      if (k + 1 < S) a.next = ranks[t.stages[k + 1].node];
      a.microbatches = pipelines[p].microbatches;
      gpu += spec.gpus;
      const rank r = ranks[spec.node];
      e.stages_[r.value].push_back(a);
      for (int l = spec.first_layer.value; l < spec.end_layer.value; ++l) e.holders_[l].push_back(r);
    }
  }
  for (auto& h : e.holders_) std::sort(h.begin(), h.end());
  // Copies in ranks; a source that runs no stage this epoch still gets a rank (after the others,
  // by node id) because it must send.
  std::vector<node_id> senders;
  for (const auto& c : copies)
    if (!rank_of.count(c.from_node)) senders.push_back(c.from_node);
  std::sort(senders.begin(), senders.end());
  senders.erase(std::unique(senders.begin(), senders.end()), senders.end());
  for (node_id n : senders) add_rank(n);
  for (const auto& c : copies) {
    const layer_index l = c.layer;
    if (l.value < 0 || l.value >= num_layers) refuse("copy of " + to_string(l) + ", which does not exist");
    const auto to = rank_of.find(c.to_node);
    const auto& h = e.holders_[static_cast<std::size_t>(l.value)];
    if (to == rank_of.end() || !std::binary_search(h.begin(), h.end(), to->second))
      refuse("copy of " + to_string(l) + " to " + to_string(c.to_node) + ", which runs no stage holding it");
    const rank from = rank_of.at(c.from_node);
    if (from == to->second) refuse("copy of " + to_string(l) + " from " + to_string(c.from_node) + " to itself");
    e.copies_.push_back({l, from, to->second, c.bytes});
  }
  return e;
}

std::vector<rank_link> p2p_links(const epoch& e) {
  std::vector<rank_link> links;
  auto both_ways = [&](rank a, rank b) {
    if (a == b) return;
    links.push_back({a, b});
    links.push_back({b, a});
  };
  for (const auto& p : e.pipelines()) {
    for (std::size_t i = 1; i < p.ranks.size(); ++i) both_ways(p.ranks[i - 1], p.ranks[i]);
    if (p.ranks.size() > 2) both_ways(p.ranks.front(), p.ranks.back());
  }
  for (const auto& c : e.copies())
    if (c.from != c.to) links.push_back({c.from, c.to});
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  return links;
}

epoch map_epoch(const job_plan& plan) { return map_epoch(plan.templates, plan.pipelines, {}); }

epoch map_epoch(const template_set& templates, const reconfiguration& r) {
  if (r.action != reconfiguration_action::continue_training)
    throw std::invalid_argument("map_epoch: the reconfiguration stops training (" + r.reason + ")");
  return map_epoch(templates, r.pipelines, r.copies);
}

}  // namespace oobleck::planning
