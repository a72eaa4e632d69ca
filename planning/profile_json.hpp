#pragma once
// The JSON form of a profile (the planner issue's format), read and written.

#include <string>
#include <string_view>

#include "planning/json.hpp"
#include "planning/profile.hpp"

namespace oobleck::planning {

/// Parses and validates a profile. Unknown keys are an error (a misspelt "forward_ms" must not
/// silently become a missing width). Throws planning_error with one line naming the problem.
profile profile_from_json(std::string_view text);

/// The JSON form; profile_from_json(profile_to_json(p)) == p.
json::value profile_to_json(const profile& p);

}  // namespace oobleck::planning
