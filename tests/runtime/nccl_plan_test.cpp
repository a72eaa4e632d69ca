// The NCCL communicators an epoch needs, as pure data (runtime/nccl_plan.hpp): the rules that keep
// every rank's ncclCommSplit calls in step, checked on any machine.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <vector>

#include "runtime/nccl_plan.hpp"

using namespace oobleck::runtime::nccl_plan;

namespace {

/// Every communicator of every round, and no rank twice in a round.
std::set<std::vector<int>> check_rounds(const std::vector<split_round>& rounds, int world) {
  std::set<std::vector<int>> all;
  for (const auto& round : rounds) {
    std::vector<int> seen(static_cast<std::size_t>(world), 0);
    for (const auto& comm : round.comms) {
      for (int m : comm) CHECK(++seen[static_cast<std::size_t>(m)] == 1);
      CHECK(all.insert(comm).second);
    }
  }
  return all;
}

}  // namespace

TEST_CASE("nccl_plan: groups are sorted, deduplicated, and the world and single ranks need no communicator") {
  CHECK(canonical_group({3, 1, 3, 0}, 4) == std::vector<int>{0, 1, 3});
  CHECK_THROWS_AS(canonical_group({0, 4}, 4), std::invalid_argument);
  CHECK(is_world({0, 1, 2, 3}, 4));
  CHECK_FALSE(is_world({0, 1, 3}, 4));
  const auto rounds = plan_groups({{2, 1, 0, 3}, {1}, {0, 1}, {1, 0}, {}}, {}, 4);
  const auto all = check_rounds(rounds, 4);
  CHECK(all == std::set<std::vector<int>>{{0, 1}});
}

TEST_CASE("nccl_plan: overlapping groups go to different rounds, disjoint ones share a round") {
  // Per-layer groups of a 6-rank epoch: pipelines {0,1,2} and {3,4,5}, layers split differently.
  const std::vector<std::vector<int>> groups{{0, 3}, {0, 4}, {1, 4}, {2, 5}, {1, 5}, {0, 3}};
  const auto rounds = plan_groups(groups, {}, 6);
  const auto all = check_rounds(rounds, 6);
  CHECK(all.size() == 5);
  // {0,3}, {1,4}, {2,5} are disjoint: the first round takes them (first fit in sorted order).
  REQUIRE(!rounds.empty());
  CHECK(rounds[0].comms == std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}});
  CHECK(rounds.size() == 2);
}

TEST_CASE("nccl_plan: every rank computes the same rounds, whatever it is a member of") {
  const std::vector<std::vector<int>> groups{{4, 0}, {1, 2}, {0, 1, 2}, {3, 4}};
  const auto a = plan_groups(groups, {}, 5);
  // The list in another order (another thread built it) gives the same rounds.
  auto shuffled = groups;
  std::reverse(shuffled.begin(), shuffled.end());
  const auto b = plan_groups(shuffled, {}, 5);
  REQUIRE(a.size() == b.size());
  for (std::size_t r = 0; r < a.size(); ++r) CHECK(a[r].comms == b[r].comms);
  // Each rank's colour and key: members get the index of their communicator and their position.
  for (const auto& round : a)
    for (int rank = 0; rank < 5; ++rank) {
      const auto args = args_of(round, rank);
      if (!args.member()) continue;
      const auto& comm = round.comms[static_cast<std::size_t>(args.color)];
      CHECK(comm[static_cast<std::size_t>(args.key)] == rank);
    }
}

TEST_CASE("nccl_plan: a second call makes only new groups, and the same number of rounds on every rank") {
  // The old filter skipped a group this rank already had a communicator for: a member skipped
  // it, a non-member split again, and the two ranks' split collectives paired up wrongly.
  const std::vector<std::vector<int>> first{{0, 1}, {2, 3}};
  const auto r1 = plan_groups(first, {}, 4);
  std::vector<std::vector<int>> made;
  for (const auto& r : r1) made.insert(made.end(), r.comms.begin(), r.comms.end());
  const auto r2 = plan_groups({{0, 1}, {1, 2}, {2, 3}}, made, 4);
  const auto all = check_rounds(r2, 4);
  CHECK(all == std::set<std::vector<int>>{{1, 2}});
  CHECK(r2.size() == 1);
  CHECK(plan_groups(first, made, 4).empty());
}

TEST_CASE("nccl_plan: one link per direction, sender first, rounds of disjoint pairs") {
  // A 3-stage pipeline on ranks 2 -> 0 -> 1 (stage order is not rank order) and the tied
  // embedding's exchange between its first and last stage.
  const std::vector<std::pair<int, int>> links{{2, 0}, {0, 1}, {1, 0}, {0, 2}, {2, 1}, {1, 2}, {2, 0}};
  const auto rounds = plan_links(links, {}, 3);
  const auto all = check_rounds(rounds, 3);
  CHECK(all.size() == 6);
  CHECK(all.count({2, 0}) == 1);
  CHECK(all.count({0, 2}) == 1);
  for (const auto& round : rounds)
    for (const auto& comm : round.comms) {
      REQUIRE(comm.size() == 2);
      // The sender is rank 0 of the link's communicator, the receiver rank 1.
      CHECK(args_of(round, comm[0]).key == 0);
      CHECK(args_of(round, comm[1]).key == 1);
    }
  CHECK_THROWS_AS(plan_links({{1, 1}}, {}, 3), std::invalid_argument);
  CHECK_THROWS_AS(plan_links({{0, 3}}, {}, 3), std::invalid_argument);
  CHECK(plan_links({{0, 1}}, {{0, 1}}, 3).empty());
}

TEST_CASE("nccl_plan: a broadcast's root is its rank in the group's communicator, not in the world") {
  // The old code reused the world communicator for a group of every rank listed in another order
  // and passed the root's position in that list.
  const auto g = canonical_group({3, 0, 2, 1}, 4);
  CHECK(rank_in(g, 3) == 3);  // the world communicator: the world rank
  const auto sub = canonical_group({5, 2}, 6);
  CHECK(rank_in(sub, 5) == 1);
  CHECK(rank_in(sub, 2) == 0);
  CHECK_THROWS_AS(rank_in(sub, 4), std::invalid_argument);
}
