#include "runtime/transport/transport_handshake.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>
#include <string>

namespace oobleck::runtime {

challenge_bytes fresh_challenge() {
  challenge_bytes c;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(c.data()), static_cast<int>(c.size())) != 1)
    throw std::runtime_error("the transport's handshake: the random generator failed");
  return c;
}

proof_bytes link_proof(link_role who, std::string_view key, std::string_view nonce, const link_claim& claim,
                       const challenge_bytes& acceptor_challenge, const challenge_bytes& dialer_challenge) {
  // Fixed-width fields and a length before the one variable field: no two claims share bytes.
  std::string message = who == link_role::dialer ? "oobleck data link v2: dialer" : "oobleck data link v2: acceptor";
  std::byte fixed[8];
  auto append = [&](std::span<const std::byte> b) { message.append(reinterpret_cast<const char*>(b.data()), b.size()); };
  put_u64(fixed, nonce.size());
  append({fixed, 8});
  message.append(nonce);
  put_u64(fixed, claim.epoch);
  append({fixed, 8});
  for (int v : {claim.dialer, claim.acceptor, claim.world}) {
    put_u32(fixed, static_cast<std::uint32_t>(v));
    append({fixed, 4});
  }
  append(acceptor_challenge);
  append(dialer_challenge);
  proof_bytes out;
  unsigned int length = 0;
  const char* key_bytes = key.empty() ? "" : key.data();  // never null: OpenSSL reads null as "no key"
  if (!HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), reinterpret_cast<unsigned char*>(out.data()), &length) ||
      length != out.size())
    throw std::runtime_error("the transport's handshake: HMAC-SHA256 failed");
  return out;
}

bool proof_matches(std::span<const std::byte> received, const proof_bytes& expected) {
  return received.size() == expected.size() && CRYPTO_memcmp(received.data(), expected.data(), expected.size()) == 0;
}

}  // namespace oobleck::runtime
