#pragma once
// The JSON form of a profile (README, "Profile JSON"), read and written on nlohmann-json.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "planning/profile.hpp"

namespace oobleck::messages {

/// Decodes and validates (validate_profile) a profile. Strict: unknown and duplicate keys, wrong
/// types and out-of-range numbers are input_error naming the key path
/// ("profile.layers[3].forward_ms: expected an object, got number").
planning::profile profile_from_json(std::string_view text);

/// The JSON form, keys in the documented order; profile_from_json(dump) gives the profile back.
nlohmann::ordered_json profile_to_json(const planning::profile& p);

/// profile_to_json as text (indent -1: one line).
std::string profile_json_text(const planning::profile& p, int indent = 2);

}  // namespace oobleck::messages
