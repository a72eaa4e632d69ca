#pragma once
// Which NCCL communicators an epoch needs and how they are made, as pure data (no NCCL, no CUDA,
// no LibTorch), so the rules that keep every rank in step are tested on any machine.
//
// NCCL makes sub-communicators with ncclCommSplit, a collective over the parent: every rank of
// the world calls it the same number of times, in the same order, each call giving every rank at
// most one new communicator (its colour). So the communicators an epoch needs are planned as
// rounds of communicators with disjoint members, computed from inputs every rank has (never from
// what this rank is a member of: a filter that depends on membership gives two ranks different
// numbers of rounds, and the split collectives then pair up wrongly).
//
// Two kinds of communicator:
// - a group: the members of a per-layer gradient all-reduce (or of a layer copy's broadcast),
//   kept as a sorted rank list; a member's rank in the communicator is its position in that list,
//   whatever order a caller lists the group in;
// - a link: one direction of point-to-point traffic, [sender, receiver] (rank 0 sends, rank 1
//   receives). One communicator per direction: NCCL runs the operations of one communicator one
//   after the other, so with activations and gradients of 1F1B on one communicator a stage's
//   send to the next stage could wait for that stage's receive while that stage waits for the
//   gradient this stage has not yet received: the deadlock that batched send/recv pairs avoid
//   elsewhere. With a communicator per direction each one carries a chain of messages with no
//   cycle of waits.

#include <cstddef>
#include <utility>
#include <vector>

namespace oobleck::runtime::nccl_plan {

/// NCCL_SPLIT_NOCOLOR: the rank is in no communicator of a round.
inline constexpr int no_color = -1;

/// One ncclCommSplit call: the communicators it makes, each as its members in rank order.
/// No rank is a member of two of them.
struct split_round {
  std::vector<std::vector<int>> comms;
};

/// What one rank passes to ncclCommSplit in a round.
struct split_args {
  int color = no_color;  ///< the index of the communicator of the round this rank is in
  int key = 0;           ///< its rank in that communicator
  [[nodiscard]] bool member() const { return color != no_color; }
};

/// The sorted, duplicate-free form of a group; throws std::invalid_argument for a rank outside
/// [0, world).
std::vector<int> canonical_group(std::vector<int> group, int world);

/// True when the group is every rank of the world: the world communicator serves it.
bool is_world(const std::vector<int>& canonical, int world);

/// The communicators to make for `groups` that are not yet in `made` (canonical lists): one per
/// distinct canonical group of at least 2 ranks that is not the world, in rounds of disjoint
/// groups, greedily in sorted order. Depends on the arguments only, so every rank computes the
/// same rounds.
std::vector<split_round> plan_groups(const std::vector<std::vector<int>>& groups,
                                     const std::vector<std::vector<int>>& made, int world);

/// The communicators to make for directed links (sender, receiver) not yet in `made`: one per
/// distinct link, members [sender, receiver], in rounds as plan_groups. Throws
/// std::invalid_argument for a link from a rank to itself or outside the world.
std::vector<split_round> plan_links(const std::vector<std::pair<int, int>>& links,
                                    const std::vector<std::pair<int, int>>& made, int world);

/// This rank's colour and key in a round.
split_args args_of(const split_round& round, int rank);

/// The rank, inside a communicator whose members are `members` (in rank order), of world rank
/// `root`; throws std::invalid_argument when `root` is not a member.
int rank_in(const std::vector<int>& members, int root);

}  // namespace oobleck::runtime::nccl_plan
