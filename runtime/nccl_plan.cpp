#include "runtime/nccl_plan.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace oobleck::runtime::nccl_plan {

namespace {

void check_rank(int r, int world) {
  if (r < 0 || r >= world)
    throw std::invalid_argument("rank " + std::to_string(r) + " is outside a world of " + std::to_string(world));
}

/// First-fit packing of communicators (already in a canonical order) into rounds of disjoint
/// members.
std::vector<split_round> pack(const std::vector<std::vector<int>>& comms, int world) {
  std::vector<split_round> rounds;
  std::vector<std::vector<bool>> used;  // used[round][rank]
  for (const auto& members : comms) {
    std::size_t r = 0;
    for (; r < rounds.size(); ++r)
      if (std::none_of(members.begin(), members.end(), [&](int m) { return used[r][static_cast<std::size_t>(m)]; }))
        break;
    if (r == rounds.size()) {
      rounds.emplace_back();
      used.emplace_back(static_cast<std::size_t>(world), false);
    }
    rounds[r].comms.push_back(members);
    for (int m : members) used[r][static_cast<std::size_t>(m)] = true;
  }
  return rounds;
}

}  // namespace

std::vector<int> canonical_group(std::vector<int> group, int world) {
  for (int r : group) check_rank(r, world);
  std::sort(group.begin(), group.end());
  group.erase(std::unique(group.begin(), group.end()), group.end());
  return group;
}

bool is_world(const std::vector<int>& canonical, int world) {
  return static_cast<int>(canonical.size()) == world;  // sorted and unique within [0, world)
}

std::vector<split_round> plan_groups(const std::vector<std::vector<int>>& groups,
                                     const std::vector<std::vector<int>>& made, int world) {
  std::set<std::vector<int>> wanted;
  const std::set<std::vector<int>> done(made.begin(), made.end());
  for (const auto& g : groups) {
    auto c = canonical_group(g, world);
    if (c.size() < 2 || is_world(c, world) || done.count(c)) continue;
    wanted.insert(std::move(c));
  }
  return pack({wanted.begin(), wanted.end()}, world);
}

std::vector<split_round> plan_links(const std::vector<std::pair<int, int>>& links,
                                    const std::vector<std::pair<int, int>>& made, int world) {
  std::set<std::pair<int, int>> wanted;
  const std::set<std::pair<int, int>> done(made.begin(), made.end());
  for (const auto& [from, to] : links) {
    check_rank(from, world);
    check_rank(to, world);
    if (from == to) throw std::invalid_argument("a link from rank " + std::to_string(from) + " to itself");
    if (!done.count({from, to})) wanted.insert({from, to});
  }
  std::vector<std::vector<int>> comms;
  for (const auto& [from, to] : wanted) comms.push_back({from, to});
  return pack(comms, world);
}

split_args args_of(const split_round& round, int rank) {
  for (std::size_t c = 0; c < round.comms.size(); ++c) {
    const auto& members = round.comms[c];
    const auto at = std::find(members.begin(), members.end(), rank);
    if (at != members.end()) return {static_cast<int>(c), static_cast<int>(at - members.begin())};
  }
  return {};
}

int rank_in(const std::vector<int>& members, int root) {
  const auto at = std::find(members.begin(), members.end(), root);
  if (at == members.end()) throw std::invalid_argument("rank " + std::to_string(root) + " is not a member");
  return static_cast<int>(at - members.begin());
}

}  // namespace oobleck::runtime::nccl_plan
