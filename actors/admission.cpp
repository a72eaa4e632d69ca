#include "actors/admission.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <caf/sec.hpp>

#include "messages/input_error.hpp"
#include "messages/protocol.hpp"

namespace oobleck::actors {

namespace {

std::string to_hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

/// Compares in time independent of where the strings differ.
bool equal_constant_time(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string short_hash(const std::string& h) { return h.empty() ? "(none)" : h.substr(0, 12); }

}  // namespace

std::string hmac_sha256_hex(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len))
    throw std::runtime_error("HMAC-SHA256 failed");
  return to_hex(out, len);
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(bytes.data(), bytes.size(), out, &len, EVP_sha256(), nullptr))
    throw std::runtime_error("SHA-256 failed");
  return to_hex(out, len);
}

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1)
    throw std::runtime_error("the system's random generator failed");
  return to_hex(reinterpret_cast<const unsigned char*>(raw.data()), bytes);
}

std::string admission_proof(std::string_view token, std::string_view nonce, std::string_view name) {
  // Each kind of proof has its own prefix, so one can never pass for another.
  std::string message = "register\n";
  message += nonce;
  message += '\n';
  message += name;
  return hmac_sha256_hex(token, message);
}

std::string control_proof_of(std::string_view token, std::string_view nonce) {
  std::string message = "control\n";
  message += nonce;
  return hmac_sha256_hex(token, message);
}

std::string read_token_file(const std::string& path) {
  struct stat st {};
  // What a user gave or must fix is bad input (exit status 2), never an internal error.
  if (::stat(path.c_str(), &st) != 0) throw messages::input_error("token file " + path + ": " + std::strerror(errno));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw messages::input_error("token file " + path + " is accessible by group or others; run chmod 600 " + path);
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 32)
    throw messages::input_error("token file " + path + " holds no token of at least 32 characters");
  return token;
}

std::string create_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) throw messages::input_error("cannot create token file " + path + ": " + std::strerror(errno));
  const std::string token = random_hex(32);
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write token file " + path);
  return token;
}

void nonce_book::forget(std::deque<entry>::iterator it) {
  if (auto h = held_.find(it->owner); h != held_.end() && --h->second == 0) held_.erase(h);
  issued_.erase(it);
}

std::size_t nonce_book::outstanding(const std::string& owner) const {
  const auto it = held_.find(owner);
  return it == held_.end() ? 0 : it->second;
}

std::optional<std::string> nonce_book::issue(clock::time_point now, const std::string& owner) {
  while (!issued_.empty() && now - issued_.front().at > ttl_) forget(issued_.begin());
  const auto oldest_of = [this](const std::string& who) {
    return std::find_if(issued_.begin(), issued_.end(), [&](const entry& e) { return e.owner == who; });
  };
  if (outstanding(owner) >= per_owner_) {
    forget(oldest_of(owner));  // its own oldest
  } else if (issued_.size() >= capacity_) {
    const auto most = std::max_element(held_.begin(), held_.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    if (most->second < 2) return std::nullopt;  // everyone holds one: taking any would evict a stranger's only nonce
    forget(oldest_of(most->first));
  }
  issued_.push_back({random_hex(16), now, owner});
  ++held_[owner];
  return issued_.back().nonce;
}

bool nonce_book::consume(const std::string& nonce, clock::time_point now) {
  auto it = std::find_if(issued_.begin(), issued_.end(),
                         [&](const entry& e) { return e.nonce == nonce; });
  if (it == issued_.end()) return false;
  const bool fresh = now - it->at <= ttl_;
  forget(it);
  return fresh;
}

caf::error check_registration(const messages::register_node& r, const admission_policy& policy,
                              nonce_book& nonces, nonce_book::clock::time_point now) {
  using messages::make_error;
  using messages::protocol_error;
  const bool nonce_ok = nonces.consume(r.nonce, now);
  if (r.protocol_version != policy.protocol_version)
    return make_error(protocol_error::wrong_version,
                      "the worker speaks protocol " + std::to_string(r.protocol_version) +
                          ", the coordinator " + std::to_string(policy.protocol_version) +
                          "; run the same Oobleck build on every node");
  if (!nonce_ok)
    return make_error(protocol_error::bad_proof, "unknown, expired or reused nonce");
  if (!equal_constant_time(r.proof, admission_proof(policy.token, r.nonce, r.name)))
    return make_error(protocol_error::bad_proof,
                      "the worker's token differs from the coordinator's (check --token-file)");
  if (!r.job_hash.empty() && r.job_hash != policy.job_hash)
    return make_error(protocol_error::wrong_job,
                      "the worker was started for job " + short_hash(r.job_hash) +
                          ", the coordinator runs job " + short_hash(policy.job_hash));
  if (r.slots < 1 || r.slots > 64 || r.name.empty() || r.name.size() > 255 || r.data.port == 0)
    return make_error(protocol_error::bad_request,
                      "a registration needs a name (1-255 bytes), 1-64 slots and a data port");
  if (r.slots != policy.slots_per_node)
    return make_error(protocol_error::wrong_slots,
                      "the worker has " + std::to_string(r.slots) + " slot(s), the job's nodes have " +
                          std::to_string(policy.slots_per_node) + " (cluster.slots_per_node); start it with --slots " +
                          std::to_string(policy.slots_per_node));
  if (r.device != policy.device)
    return make_error(protocol_error::wrong_device,
                      "the worker computes on " + (r.device.empty() ? std::string("(none)") : r.device) +
                          ", the job's stages run on " + policy.device + " (cluster.device); start it with --device " +
                          policy.device);
  return {};
}

caf::error check_control(const messages::control_proof& p, const admission_policy& policy,
                         nonce_book& nonces, nonce_book::clock::time_point now) {
  using messages::make_error;
  using messages::protocol_error;
  if (!nonces.consume(p.nonce, now))
    return make_error(protocol_error::bad_proof, "unknown, expired or reused nonce");
  if (!equal_constant_time(p.proof, control_proof_of(policy.token, p.nonce)))
    return make_error(protocol_error::bad_proof,
                      "the request's token differs from the coordinator's (check --token-file)");
  return {};
}

std::optional<std::size_t> drop_unanswered_link(const caf::error& err, const std::function<std::size_t()>& drop,
                                                const std::function<void(const std::string&)>& log,
                                                const std::string& whose_connection) {
  if (err != caf::sec::request_timeout || !drop) return std::nullopt;
  const std::size_t dropped = drop();
  if (dropped > 0)
    log("no answer from the coordinator over " + whose_connection + " connection to it: closed it (" +
        std::to_string(dropped) + " connection(s)), connecting afresh");
  return dropped;
}

}  // namespace oobleck::actors
