#pragma once
// The transport's wire format: frames, and the handshake that opens a link.
// Private to the transport's .cpp files.

#include <cstddef>
#include <cstdint>

namespace oobleck::runtime {

/// Frame keys put the channel in the high half so collectives never see point-to-point tags.
enum class channel : std::uint32_t { p2p = 0, all_reduce = 1, broadcast = 2, shared_memory = 3 };
inline constexpr std::uint32_t channel_count = 4;  ///< a frame of another channel is a broken peer
inline std::uint64_t frame_key(channel c, std::uint32_t tag) {
  return (static_cast<std::uint64_t>(c) << 32) | tag;
}

// Every frame: key (u64) then body length (u64), little-endian, then the body. A body longer
// than transport_config::max_frame_bytes is a broken peer, never allocated.
inline constexpr std::size_t frame_header_size = 16;
// The handshake's messages: transport_handshake.hpp.
inline constexpr std::uint32_t handshake_magic = 0x4f42'5450;  // "OBTP"
inline constexpr std::uint32_t handshake_version = 2;         // 2: proofs of the key
enum class handshake_status : std::uint32_t {
  ok = 0,
  wrong_epoch = 1,
  bad_rank = 2,
  duplicate = 3,
  unauthenticated = 4,  ///< the dialer's proof of the key is wrong
};

// Explicit little-endian so the wire format does not depend on the hosts.
inline void put_u32(std::byte* at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void put_u64(std::byte* at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint32_t get_u32(const std::byte* at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(at[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const std::byte* at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  return v;
}

}  // namespace oobleck::runtime
