#pragma once
// Profile files on disk: the Cap'n Proto form (oobleck-profile's output) and the JSON form.

#include <string>

#include "planning/profile.hpp"

namespace oobleck::messages {

/// Reads a profile from a Cap'n Proto or JSON file (JSON when the first non-space byte is '{').
/// Throws planning::planning_error naming the path and the problem: unreadable, malformed or
/// inconsistent (see planning::validate).
planning::profile read_profile_file(const std::string& path);

/// Writes the Cap'n Proto form; throws planning::planning_error when the file cannot be written.
void write_profile_capnp(const planning::profile& p, const std::string& path);

/// Writes the JSON form (indented).
void write_profile_json(const planning::profile& p, const std::string& path);

}  // namespace oobleck::messages
