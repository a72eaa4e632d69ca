#pragma once
// The handshake that opens a link: both ends prove they know the epoch's key (the job token)
// without sending it, and the proofs are bound to what they admit, so that one recorded on the
// wire is worthless anywhere else. Private to the transport (and to the tests that play a
// stranger or a broken peer on raw sockets).
//
//   dialer (higher rank)                           acceptor (lower rank)
//                          <-- greeting: magic, version, acceptor challenge (fresh per connection)
//   hello: magic, version, epoch, dialer rank, world, dialer challenge,
//          proof(dialer)  -->
//                              the acceptor checks epoch, ranks and the proof, and only then
//                              reserves the dialer's rank (a stranger cannot take it)
//                          <-- ack: magic, status, epoch, proof(acceptor) (zeros unless ok)
//   the dialer checks the acceptor's proof (a listener that is not the epoch's rank is refused)
//
// proof(role) = HMAC-SHA256(key, label(role) | nonce | epoch | dialer rank | acceptor rank |
//                                world | acceptor challenge | dialer challenge)
// The acceptor's challenge makes every dialer proof single-use (no replay), the nonce and the
// epoch bind it to one epoch, the ranks to one link, the role label keeps one side's proof from
// passing for the other's.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "runtime/transport/transport_wire.hpp"

namespace oobleck::runtime {

inline constexpr std::size_t challenge_size = 16;
inline constexpr std::size_t proof_size = 32;  // HMAC-SHA256
/// acceptor -> dialer, at once: magic, version, challenge.
inline constexpr std::size_t greeting_size = 8 + challenge_size;
/// dialer -> acceptor: magic, version, epoch, rank, world, challenge, proof.
inline constexpr std::size_t hello_size = 24 + challenge_size + proof_size;
/// acceptor -> dialer: magic, status, epoch, proof.
inline constexpr std::size_t ack_size = 16 + proof_size;

using challenge_bytes = std::array<std::byte, challenge_size>;
using proof_bytes = std::array<std::byte, proof_size>;

enum class link_role { dialer, acceptor };

/// What a proof is about: one link of one epoch.
struct link_claim {
  std::uint64_t epoch = 0;
  int dialer = 0;
  int acceptor = 0;
  int world = 0;
};

/// Cryptographically random bytes (OpenSSL RAND_bytes); throws std::runtime_error if the
/// generator fails.
challenge_bytes fresh_challenge();

/// HMAC-SHA256 of the link's claim under `key`, as `who` sends it.
proof_bytes link_proof(link_role who, std::string_view key, std::string_view nonce, const link_claim& claim,
                       const challenge_bytes& acceptor_challenge, const challenge_bytes& dialer_challenge);

/// Constant-time comparison of a received proof with the expected one.
bool proof_matches(std::span<const std::byte> received, const proof_bytes& expected);

}  // namespace oobleck::runtime
