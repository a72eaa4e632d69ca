#pragma once
// Helpers shared by the transport tests: ranks on threads, order-sensitive data, the reference
// ring-order sum, and checksums.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime::transport_testing {

/// How long a failure may take to reach a pending operation before a test calls it a hang. The
/// transport has no data timeouts: an operation that is not failed at once by a lost peer or an
/// abort stays blocked for good, so a bound of seconds tells "fails by itself" from "hangs"
/// without timing anything on a loaded machine. The latencies themselves (milliseconds) are
/// measured by bench/transport_failure_latency.
inline constexpr std::chrono::milliseconds fails_within{5'000};

/// How long run_ranks lets the ranks' bodies run (they take well under a second each).
inline constexpr std::chrono::seconds ranks_deadline{30};

inline constexpr std::size_t mib = std::size_t{1} << 20;

/// Two byte strings equal in size and content.
inline bool same(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

/// The key the tests' transports prove (a job's token in a real run).
inline const std::string test_key = "transport-tests-token-0123456789abcdef";

/// Transports for `n` ranks on loopback, each listening on a free port, authenticated with
/// test_key and a nonce of the epoch.
/// `adjust` (if given) changes each rank's config before its transport is made.
inline std::vector<std::unique_ptr<host_transport>> make_transports(
    int n, std::uint64_t epoch, std::vector<std::uint16_t> ports = {},
    const std::function<void(transport_config&)>& adjust = {}) {
  std::vector<std::unique_ptr<host_transport>> ts;
  for (int r = 0; r < n; ++r) {
    transport_config c{.rank = r,
                       .peers = std::vector<peer_endpoint>(static_cast<std::size_t>(n)),
                       .epoch = epoch,
                       .auth_key = test_key,
                       .auth_nonce = "nonce-of-epoch-" + std::to_string(epoch)};
    if (!ports.empty())
      c.peers[static_cast<std::size_t>(r)].port = ports[static_cast<std::size_t>(r)];
    if (adjust) adjust(c);
    ts.push_back(std::make_unique<host_transport>(c));
  }
  return ts;
}

inline std::vector<peer_endpoint> endpoints_of(
    const std::vector<std::unique_ptr<host_transport>>& ts) {
  std::vector<peer_endpoint> eps;
  for (const auto& t : ts) eps.push_back({"127.0.0.1", t->listen_port()});
  return eps;
}

/// Aborts every transport of `ts` as it goes out of scope. Declared after a test's own threads
/// or futures (so destroyed before them), it ends their waits when a failed REQUIRE leaves the
/// test early, instead of blocking in their destructors.
struct abort_all_on_exit {
  std::vector<std::unique_ptr<host_transport>>& ts;
  ~abort_all_on_exit() {
    for (auto& t : ts) t->abort("the test ended");
  }
};

/// Connects the transports and runs body(rank, transport) on one thread per rank. Exceptions
/// from the bodies are rethrown here (first one wins) so the test sees them. Fails instead of
/// hanging: ranks still running at `deadline` have their transports aborted, which fails
/// whatever they wait for in them, and the call throws; a rank stuck elsewhere even then ends
/// the test program (its thread refers to this frame, so nothing can return without it).
template <class Body>
void run_ranks(std::vector<std::unique_ptr<host_transport>>& ts, Body body,
               std::chrono::seconds deadline = ranks_deadline) {
  const auto eps = endpoints_of(ts);
  std::vector<std::exception_ptr> errors(ts.size());
  std::mutex mu;
  std::condition_variable cv;
  std::size_t finished = 0;
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < ts.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        ts[r]->connect(eps);
        body(static_cast<int>(r), *ts[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      {
        std::lock_guard lock(mu);
        ++finished;
      }
      cv.notify_all();
    });
  auto all_finished = [&](std::chrono::seconds within) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, within, [&] { return finished == ts.size(); });
  };
  const bool in_time = all_finished(deadline);
  if (!in_time) {
    // A body that destroyed its own transport has left a null here.
    for (auto& t : ts)
      if (t) t->abort("run_ranks: the test's deadline passed");
    if (!all_finished(std::chrono::seconds(10))) {
      std::fprintf(stderr, "run_ranks: ranks still running 10 s after their deadline (%llds) and "
                           "an abort of every transport; ending the test program\n",
                   static_cast<long long>(deadline.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  if (!in_time)
    throw std::runtime_error("run_ranks: the ranks did not finish within " +
                             std::to_string(deadline.count()) + " s (their transports were aborted)");
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

template <class Body>
void run_ranks(int n, Body body, std::uint64_t epoch = 1,
               const std::function<void(transport_config&)>& adjust = {}) {
  auto ts = make_transports(n, epoch, {}, adjust);
  run_ranks(ts, body);
}

/// Values whose float sum depends on the order of addition: large values of both signs with
/// tiny ones mixed in, so cancellation and absorption differ between orders.
inline std::vector<float> order_sensitive_data(std::size_t count, std::uint32_t seed) {
  std::mt19937 gen(seed * 7919u + 17u);
  std::uniform_real_distribution<float> big(-1e6f, 1e6f);
  std::uniform_real_distribution<float> small(-1e-2f, 1e-2f);
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = (i % 3 == 1) ? small(gen) : big(gen);
  return v;
}

/// The documented result of all_reduce_sum: chunk c (data.size()*c/n up to data.size()*(c+1)/n)
/// summed left to right in ring order starting at group position c. inputs[i] is position i's.
inline std::vector<float> ring_reference(const std::vector<std::vector<float>>& inputs) {
  const std::size_t n = inputs.size();
  const std::size_t len = inputs[0].size();
  std::vector<float> out(len);
  for (std::size_t c = 0; c < n; ++c)
    for (std::size_t k = len * c / n; k < len * (c + 1) / n; ++k) {
      float acc = inputs[c][k];
      for (std::size_t j = 1; j < n; ++j) acc = acc + inputs[(c + j) % n][k];
      out[k] = acc;
    }
  return out;
}

/// How many elements of `result` differ bitwise from the plain left-to-right sum in position
/// order: proof that the data would expose a member reducing in its own order.
inline std::size_t differs_from_serial(const std::vector<std::vector<float>>& inputs,
                                       const std::vector<float>& result) {
  std::size_t differ = 0;
  for (std::size_t k = 0; k < result.size(); ++k) {
    float acc = inputs[0][k];
    for (std::size_t j = 1; j < inputs.size(); ++j) acc += inputs[j][k];
    if (std::memcmp(&acc, &result[k], sizeof(float)) != 0) ++differ;
  }
  return differ;
}

/// Largest |result - exact sum| relative to the sum of magnitudes (rounding only: ~1e-7).
inline double worst_relative_error(const std::vector<std::vector<float>>& inputs,
                                   const std::vector<float>& result) {
  double worst = 0;
  for (std::size_t k = 0; k < result.size(); ++k) {
    double exact = 0, magnitude = 0;
    for (const auto& in : inputs) {
      exact += in[k];
      magnitude += in[k] < 0 ? -in[k] : in[k];
    }
    const double err = (result[k] - exact) / (magnitude > 0 ? magnitude : 1.0);
    worst = std::max(worst, err < 0 ? -err : err);
  }
  return worst;
}

/// FNV-1a over the bytes, to compare results across processes.
inline std::uint64_t checksum(std::span<const float> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::byte b : std::as_bytes(v)) h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  return h;
}

/// A deterministic byte pattern that differs per message (xorshift64, 8 bytes a step).
inline std::vector<std::byte> pattern(std::size_t size, std::uint32_t seed) {
  std::vector<std::byte> v(size);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1ull);
  for (std::size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, size - i));
  }
  return v;
}

/// Polls `done` until it holds or `timeout` passes; true if it held. For effects that another
/// thread (the transport's I/O thread) completes shortly after the event the test observed.
template <class Pred>
bool eventually(Pred done, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace oobleck::runtime::transport_testing
