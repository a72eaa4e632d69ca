#pragma once
// The transport's locking rule as types. Fields that several threads share live inside a
// guarded<T>, and a guarded<T> opens only for a `locked`, which holds the transport's mutex for
// as long as it exists: code that has no lock in scope cannot name those fields.
// Private to the transport's .cpp files.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace oobleck::runtime {

/// Holds the transport's mutex (state::mu) from construction to destruction.
class locked {
 public:
  explicit locked(std::mutex& mu) : lock_(mu) {}
  locked(const locked&) = delete;
  locked& operator=(const locked&) = delete;

  /// Runs `fn` with the mutex released and takes it back. Only for work on what this thread
  /// alone owns meanwhile (a claimed receive's bytes), never on guarded fields.
  template <class Fn>
  void unlocked(Fn&& fn) {
    lock_.unlock();
    struct relock {
      std::unique_lock<std::mutex>& lock;
      ~relock() { lock.lock(); }
    } again{lock_};
    std::forward<Fn>(fn)();
  }
  /// Waits on `cv` (paired with the same mutex) until `done()` holds.
  template <class Pred>
  void wait(std::condition_variable& cv, Pred done) {
    cv.wait(lock_, std::move(done));
  }
  /// Same, until `deadline`; returns done().
  template <class Pred>
  bool wait_until(std::condition_variable& cv, std::chrono::steady_clock::time_point deadline,
                  Pred done) {
    return cv.wait_until(lock_, deadline, std::move(done));
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

/// A value read and written only under the transport's mutex: `g(lock)` is the value.
template <class T>
class guarded {
 public:
  T& operator()(const locked&) { return value_; }
  const T& operator()(const locked&) const { return value_; }

 private:
  T value_{};
};

}  // namespace oobleck::runtime
