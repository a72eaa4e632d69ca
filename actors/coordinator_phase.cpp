#include "actors/coordinator_phase.hpp"

#include <utility>

namespace oobleck::actors {

namespace {

template <std::size_t... I>
std::vector<std::string_view> names_of(std::index_sequence<I...>) {
  return {std::variant_alternative_t<I, job_phase>::name...};
}

}  // namespace

std::string_view phase_name(const job_phase& p) {
  return std::visit([](const auto& ph) { return std::decay_t<decltype(ph)>::name; }, p);
}

std::vector<std::string_view> phase_names() { return names_of(std::make_index_sequence<std::variant_size_v<job_phase>>{}); }

bool transition_allowed(std::string_view from, std::string_view to) {
  for (const auto& t : transitions)
    if ((t.from == from || t.from == "any") && t.to == to) return true;
  return false;
}

}  // namespace oobleck::actors
