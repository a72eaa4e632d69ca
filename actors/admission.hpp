#pragma once
// Admission of worker nodes (ARCHITECTURE.md §5), as plain functions the coordinator actor calls; the
// messages are in messages/admission_messages.hpp. The job token never crosses the wire: the
// coordinator hands out a single-use random nonce; the worker answers with
// HMAC-SHA256(token, "register\n" + nonce + "\n" + name) in hex; the coordinator recomputes it. A
// wrong version, another job's config or a bad proof is refused with a protocol_error that says
// what differs (also a worker whose --slots is not the job's M), and nothing of the running job
// changes.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <caf/error.hpp>

#include "messages/admission_messages.hpp"

namespace oobleck::actors {

/// Lower-case hex of HMAC-SHA256(key, message).
std::string hmac_sha256_hex(std::string_view key, std::string_view message);
/// Lower-case hex of SHA-256(bytes): the job hash is this over the job file's text.
std::string sha256_hex(std::string_view bytes);
/// `bytes` bytes from the OS's cryptographic generator, in hex.
std::string random_hex(std::size_t bytes);

/// The proof a worker sends for `nonce`.
std::string admission_proof(std::string_view token, std::string_view nonce, std::string_view name);

/// The proof an operator's request carries (messages::control_proof).
std::string control_proof_of(std::string_view token, std::string_view nonce);

/// Reads the job token from `path`: one line of at least 32 characters; the file must not be
/// readable by group or others (like ssh keys). Throws std::runtime_error saying what is wrong.
std::string read_token_file(const std::string& path);
/// Creates `path` (mode 0600, refusing to overwrite) holding a fresh 256-bit token; returns it.
std::string create_token_file(const std::string& path);

/// A request to the coordinator got no answer at all (`err` is a request timeout) over a
/// connection that completed CAF's handshake: the coordinator froze, or CAF 0.17 lost the
/// connection's route on its side (apps/coordinator_link.hpp) and every later request over it
/// would go unanswered too. Where `drop` is given, closes this process's connections to the
/// coordinator (drop()) and, when it closed any, says so through `log`, naming `whose_connection`
/// ("this node's", "the injector's"). Returns how many it closed (0: the request went over a
/// connection that had already ended), or nullopt when `err` is not a timeout or there is no
/// `drop`. A worker's monitor and the failure injector both call it.
std::optional<std::size_t> drop_unanswered_link(const caf::error& err, const std::function<std::size_t()>& drop,
                                                const std::function<void(const std::string&)>& log,
                                                const std::string& whose_connection);

/// Nonces handed out and not used yet. Each is valid once, for `ttl`. Nobody has proven anything
/// when asking for one, so the book is bounded against floods without letting one asker take
/// another's nonce away: an owner (who asked: a remote process, i.e. one connection, or a local
/// actor) holds at most `per_owner` nonces, its own oldest forgotten first; when the book holds
/// `capacity` nonces, the oldest nonce of the owner holding most is forgotten, but never the only
/// nonce of an owner: when every owner holds one, the new request is refused instead. So a
/// worker's pending nonce survives any flood of requests from others until it expires.
class nonce_book {
 public:
  using clock = std::chrono::steady_clock;
  explicit nonce_book(std::chrono::seconds ttl = std::chrono::seconds(60), std::size_t capacity = 1024,
                      std::size_t per_owner = 4)
      : ttl_(ttl), capacity_(std::max<std::size_t>(capacity, 1)), per_owner_(std::max<std::size_t>(per_owner, 1)) {}
  /// A fresh nonce for `owner`, issued at `now`; nullopt when the book is full of other owners'
  /// single nonces (the request is refused, nobody's nonce is taken).
  std::optional<std::string> issue(clock::time_point now, const std::string& owner = {});
  /// True, once, for a nonce issued less than ttl before `now`.
  bool consume(const std::string& nonce, clock::time_point now);
  [[nodiscard]] std::size_t outstanding() const { return issued_.size(); }
  /// The nonces `owner` holds.
  [[nodiscard]] std::size_t outstanding(const std::string& owner) const;

 private:
  struct entry {
    std::string nonce;
    clock::time_point at;
    std::string owner;
  };
  void forget(std::deque<entry>::iterator it);
  std::chrono::seconds ttl_;
  std::size_t capacity_;
  std::size_t per_owner_;
  std::deque<entry> issued_;  ///< oldest first
  std::map<std::string, std::size_t> held_;  ///< per owner: its entries in issued_
};

/// What the coordinator checks a registration against.
struct admission_policy {
  std::string token;
  std::string job_hash;
  std::uint32_t protocol_version = 0;
  /// The job's M (cluster.slots_per_node): the planner cuts every pipeline for nodes of exactly
  /// M slots, so a worker with any other --slots could not run what it would be assigned.
  std::int32_t slots_per_node = 1;
  /// The job's cluster.device ("cpu" or "cuda"): a worker computing elsewhere is refused.
  std::string device = "cpu";
  /// cluster.data_plane "nccl": NCCL takes one GPU per rank, so the coordinator refuses a worker
  /// whose GPU (register_node::device_index) a live node of the same host (data plane address)
  /// already has.
  bool one_gpu_per_worker = false;
};

/// Checks `r` (its nonce is consumed whatever the outcome); an empty error admits it.
caf::error check_registration(const messages::register_node& r, const admission_policy& policy,
                              nonce_book& nonces, nonce_book::clock::time_point now);

/// Checks an operator's proof (its nonce is consumed whatever the outcome).
caf::error check_control(const messages::control_proof& p, const admission_policy& policy,
                         nonce_book& nonces, nonce_book::clock::time_point now);

}  // namespace oobleck::actors
