#pragma once
// Distinct types for the three integers the runtime must never mix up (ARCHITECTURE.md §4): a node id is
// stable for the life of the job (a restarted worker gets a new one), a rank is a node's number
// in one epoch (renumbered every epoch), a layer index names a layer of the model. Each wraps an
// integer, converts from nothing implicitly and compares only with its own kind. They run from the
// coordinator's registry through the planner and the epoch mapping into the messages (each has an
// inspect(), so CAF carries it as its integer; no CAF header is needed here).

#include <compare>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace oobleck::planning {

/// A worker node, for the life of the job.
struct node_id {
  std::int64_t value = 0;
  auto operator<=>(const node_id&) const = default;
};

/// A node's number in one epoch: dense, 0 .. R-1.
struct rank {
  int value = 0;
  auto operator<=>(const rank&) const = default;
};

/// A layer of the model, 0 .. L-1.
struct layer_index {
  int value = 0;
  auto operator<=>(const layer_index&) const = default;
};

inline std::string to_string(node_id n) { return "node " + std::to_string(n.value); }
inline std::string to_string(rank r) { return "rank " + std::to_string(r.value); }
inline std::string to_string(layer_index l) { return "layer " + std::to_string(l.value); }

/// Node ids as the plain numbers operators, events and JSON show.
inline std::vector<std::int64_t> numbers(const std::vector<node_id>& ids) {
  std::vector<std::int64_t> out;
  out.reserve(ids.size());
  for (auto n : ids) out.push_back(n.value);
  return out;
}

/// Plain numbers (an operator's, a trace's, a test's literal) as node ids: the one way back.
template <class Range>
std::vector<node_id> node_ids(const Range& numbers) {
  std::vector<node_id> out;
  for (auto n : numbers) out.push_back(node_id{n});
  return out;
}
inline std::vector<node_id> node_ids(std::initializer_list<std::int64_t> numbers) {
  return node_ids<std::initializer_list<std::int64_t>>(numbers);
}

/// "no rank" where a message needs one (a first stage's previous, a last stage's next).
inline constexpr rank no_rank{-1};

// On the wire each is its integer (CAF's inspect protocol; found by argument-dependent lookup).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_id& x) {
  return f(x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rank& x) {
  return f(x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_index& x) {
  return f(x.value);
}

}  // namespace oobleck::planning
