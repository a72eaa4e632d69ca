#pragma once
// The clock of one simulated job: where its wall time goes (training steps, recovery pauses,
// checkpoints, restarts, waiting) and how many samples it completes. A policy tells it what the
// job does next; the simulator advances it to each event's time.
//
// States:  running (steps of a fixed length back to back, every k-th followed by a checkpoint)
//          stopped (no training: too few nodes, out of memory)
// and, before either, a queue of phases: finish the step in progress, then pauses of a kind.

#include <array>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace oobleck::sim {

/// Where wall time goes. `redundant` is the part of training steps spent on redundant
/// computation (Bamboo); `fallback` is work done and then lost (partial steps, progress since the
/// last checkpoint); `stopped` is time without a job to run.
enum class activity { effective, redundant, fallback, reconfiguration, checkpoint, restart, stopped };
inline constexpr int kActivities = 7;
const char* to_string(activity a);

/// A stretch of wall time spent on one activity. An effective stretch completes `samples` and
/// spends `redundant_ms` of its length on redundant computation.
struct segment {
  double start_ms = 0;
  double end_ms = 0;
  activity kind = activity::stopped;
  double samples = 0;
  double redundant_ms = 0;
  int nodes = 0;  ///< nodes training (effective stretches only)
};

/// How a configuration trains: one step every step_ms completes samples_per_step samples, of which
/// redundant_ms is redundant computation.
struct step_rate {
  double step_ms = 0;
  double samples_per_step = 0;
  double redundant_ms = 0;
  int nodes = 0;
};

class timeline {
 public:
  explicit timeline(double start_ms = 0);

  double now() const { return now_; }
  bool running() const { return running_.has_value(); }
  /// The rate the job trains at after what is queued (nullopt: stopped).
  const std::optional<step_rate>& rate() const { return running_; }

  /// A failure at now(): the step in progress is lost (fallback); a pause in progress ends here
  /// (its time so far stays counted as its kind); queued phases are dropped. Afterwards the job is
  /// stopped until pause()/run() say otherwise.
  void interrupt();
  /// The job finishes the step in progress at its current rate before what is queued next (a
  /// join enters at a step boundary). No effect unless it is running with nothing queued.
  void finish_step();
  /// Queues a pause; a checkpoint pause makes progress durable when it ends. Precondition: not running with nothing queued (interrupt() or finish_step()
  /// first, so that the step in progress is accounted for).
  void pause(activity kind, double ms);
  /// After the queue: train at this rate. Precondition as pause(); step_ms > 0.
  void run(const step_rate& rate);
  /// After the queue: no training.
  void stop();
  /// While running, every `steps`-th step (counted from the last checkpoint) is followed by a
  /// checkpoint pause of `ms` that makes progress durable; 0 disables. Resets the count.
  /// `durable_after_ms` > 0 models an asynchronous checkpoint: the pause is only the snapshot
  /// that blocks training, and the progress up to it becomes durable that much later, when the
  /// background write completes (a failure before then falls back to the checkpoint before).
  void checkpoint_every(int steps, double ms, double durable_after_ms = 0);
  /// Progress since the last durable point is lost: its effective stretches become fallback.
  /// Durable points: the start, the end of every checkpoint pause, and mark_durable().
  void fall_back_to_checkpoint();
  /// Makes all completed progress durable now (a checkpoint whose cost was charged elsewhere).
  void mark_durable();

  /// Accounts everything up to t >= now().
  void advance_to(double t);
  /// Ends at now(): a step in progress counts pro rata (samples × elapsed / step), a pause in
  /// progress counts as its kind. Nothing may be called afterwards.
  void close();

  const std::vector<segment>& segments() const { return segments_; }
  /// Totals per activity (ms), effective stretches split into effective and redundant.
  std::array<double, kActivities> breakdown() const;
  double samples() const;

 private:
  struct phase {
    bool finish_step = false;  // else a pause
    activity kind = activity::stopped;
    double ms = 0;
    step_rate rate;      // finish_step only
    bool durable = false;  // a checkpoint pause
    double durable_after = 0;  // asynchronous: its progress is durable this long after it ends
  };
  struct pending_write {
    double value = 0;  // progress up to here
    double at = 0;     // is durable from here
  };
  void make_durable(double value, double lag);
  void settle_writes(double t);
  void add(double start, double end, activity kind, double samples = 0, double redundant = 0, int nodes = 0);
  void settle_stopped();
  void require_idle(const char* what) const;

  double now_;
  double head_start_;  // start of the first queued phase, the running step, or the stopped stretch
  std::deque<phase> queue_;
  std::optional<step_rate> running_;
  int checkpoint_steps_ = 0;
  double checkpoint_ms_ = 0;
  double checkpoint_lag_ms_ = 0;
  std::deque<pending_write> writes_;
  double split_ms_;  // effective stretches never merge across this (the latest checkpoint)
  int steps_since_durable_ = 0;
  double durable_ms_;
  bool closed_ = false;
  std::vector<segment> segments_;
};

}  // namespace oobleck::sim
