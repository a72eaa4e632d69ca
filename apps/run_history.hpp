#pragma once
// The run's history in the coordinator program, for the dashboard (GET /history): committed steps,
// evaluations and reconfigurations, in memory and bounded however long the job runs. No LibTorch.
//
// Bounds: steps and evaluations each keep at most `max_points`, spread evenly over the whole run.
// When a series is full, every second point is dropped and from then on only every 2nd (then 4th,
// ...) point offered is kept: its `stride`. The kept points stay evenly spaced from the first one
// on; the newest step is always at hand (`last_step`), kept or not. Reconfigurations are rare: the newest `max_points` are kept and the
// older ones counted as dropped.
//
// Thread-safe: the coordinator's callbacks add from CAF's threads, the HTTP server reads from its own.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace oobleck::apps {

struct history_step {
  std::uint64_t step = 0;
  std::uint64_t epoch = 0;
  double loss = 0;
  double samples_per_second = 0;
  double step_ms = 0;
  double unix_ms = 0;  ///< when it committed
};

struct history_eval {
  std::uint64_t step = 0;  ///< the committed steps it followed
  double loss = 0;
  std::int64_t windows = 0;
  double unix_ms = 0;
};

struct history_reconfiguration {
  std::uint64_t step = 0;   ///< the step the new epoch resumed at
  std::uint64_t epoch = 0;  ///< the epoch that took over
  std::string action;       ///< the policy's rules ("simple", "borrow+merge", ...)
  std::vector<std::int64_t> lost, joined;
  double downtime_ms = 0;
  double unix_ms = 0;
};

/// Points kept evenly over a series of unbounded length (see the header comment).
template <class T>
class decimated_series {
 public:
  explicit decimated_series(std::size_t max_points) : max_(max_points < 2 ? 2 : max_points) {}
  void add(const T& point) {
    if (offered_++ % stride_ == 0) {
      if (points_.size() == max_) {
        std::vector<T> kept;
        kept.reserve(max_ / 2 + 1);
        for (std::size_t i = 0; i < points_.size(); i += 2) kept.push_back(points_[i]);
        points_ = std::move(kept);
        stride_ *= 2;
        // The offer just taken (offered_ - 1) may not be on the new stride: keep it only if it is.
        if ((offered_ - 1) % stride_ != 0) return;
      }
      points_.push_back(point);
    }
  }
  [[nodiscard]] const std::vector<T>& points() const { return points_; }
  [[nodiscard]] std::uint64_t offered() const { return offered_; }
  [[nodiscard]] std::uint64_t stride() const { return stride_; }

 private:
  std::size_t max_;
  std::vector<T> points_;
  std::uint64_t offered_ = 0, stride_ = 1;
};

class run_history {
 public:
  static constexpr std::size_t default_max_points = 1000;
  explicit run_history(std::size_t max_points = default_max_points);

  void add_step(const history_step& s);
  void add_eval(const history_eval& e);
  void add_reconfiguration(const history_reconfiguration& r);

  /// GET /history: {"max_points", "steps_seen", "step_stride", "last_step", "steps": [...],
  /// "evals_seen", "eval_stride", "evals": [...], "reconfigurations_dropped", "reconfigurations": [...]}
  /// (fields in README.md, "The dashboard").
  [[nodiscard]] nlohmann::ordered_json json() const;

 private:
  mutable std::mutex mutex_;
  std::size_t max_;
  decimated_series<history_step> steps_;
  decimated_series<history_eval> evals_;
  std::optional<history_step> last_step_;
  std::vector<history_reconfiguration> reconfigurations_;
  std::uint64_t reconfigurations_dropped_ = 0;
};

}  // namespace oobleck::apps
