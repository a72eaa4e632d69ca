#pragma once
// The Cap'n Proto form of a profile (messages/profile.capnp), the form oobleck-profile writes.

#include <cstddef>
#include <span>
#include <vector>

#include "planning/profile.hpp"

namespace oobleck::messages {

/// Decodes and validates (validate_profile) a profile message. The reader runs with a traversal
/// limit and a nesting limit, lists and texts are size-checked before they are copied, and every
/// integer is converted with checked_cast: malformed or hostile bytes are input_error, never a
/// crash, a hang or a narrowed value.
planning::profile profile_from_capnp(std::span<const std::byte> bytes);

/// The message as bytes (unpacked, one segment table); profile_from_capnp(bytes) gives it back.
std::vector<std::byte> profile_to_capnp(const planning::profile& p);

}  // namespace oobleck::messages
