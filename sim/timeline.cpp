#include "sim/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace oobleck::sim {

const char* to_string(activity a) {
  switch (a) {
    case activity::effective: return "effective";
    case activity::redundant: return "redundant";
    case activity::fallback: return "fallback";
    case activity::reconfiguration: return "reconfiguration";
    case activity::checkpoint: return "checkpoint";
    case activity::restart: return "restart";
    case activity::stopped: return "stopped";
  }
  return "?";
}

timeline::timeline(double start_ms)
    : now_(start_ms), head_start_(start_ms), split_ms_(start_ms), durable_ms_(start_ms) {}

void timeline::make_durable(double value, double lag) {
  split_ms_ = std::max(split_ms_, value);
  steps_since_durable_ = 0;
  if (lag > 0) {
    writes_.push_back({value, value + lag});
  } else {
    durable_ms_ = std::max(durable_ms_, value);
  }
}

void timeline::settle_writes(double t) {
  while (!writes_.empty() && writes_.front().at <= t) {
    durable_ms_ = std::max(durable_ms_, writes_.front().value);
    writes_.pop_front();
  }
}

void timeline::add(double start, double end, activity kind, double samples, double redundant, int nodes) {
  if (!(end > start)) return;
  // Consecutive stretches of the same kind and rate merge, so that long runs stay short lists.
  if (!segments_.empty()) {
    auto& last = segments_.back();
    const bool same_rate = kind != activity::effective ||
                           (last.nodes == nodes && std::abs((last.samples / (last.end_ms - last.start_ms)) -
                                                            samples / (end - start)) < 1e-12 &&
                            last.end_ms > split_ms_);
    if (last.kind == kind && last.end_ms == start && same_rate && kind != activity::checkpoint) {
      last.end_ms = end;
      last.samples += samples;
      last.redundant_ms += redundant;
      return;
    }
  }
  segments_.push_back({start, end, kind, samples, redundant, nodes});
}

void timeline::require_idle(const char* what) const {
  if (closed_) throw std::logic_error(std::string("timeline: ") + what + " after close()");
  if (queue_.empty() && running_)
    throw std::logic_error(std::string("timeline: ") + what + " while a step runs; interrupt() or finish_step() first");
}

void timeline::settle_stopped() {
  if (queue_.empty() && !running_) {
    add(head_start_, now_, activity::stopped);
    head_start_ = now_;
  }
}

void timeline::interrupt() {
  if (!queue_.empty()) {
    const auto& p = queue_.front();
    add(head_start_, now_, p.finish_step ? activity::fallback : p.kind);
    queue_.clear();
  } else if (running_) {
    add(head_start_, now_, activity::fallback);
  } else {
    add(head_start_, now_, activity::stopped);
  }
  running_.reset();
  head_start_ = now_;
}

void timeline::finish_step() {
  if (!queue_.empty() || !running_) return;
  queue_.push_back({.finish_step = true, .rate = *running_});
  running_.reset();
}

void timeline::pause(activity kind, double ms) {
  require_idle("pause");
  if (!(ms >= 0)) throw std::logic_error("timeline: negative pause");
  settle_stopped();
  if (ms > 0) {
    queue_.push_back({.kind = kind, .ms = ms, .durable = kind == activity::checkpoint});
  } else if (kind == activity::checkpoint && queue_.empty()) {
    mark_durable();
  }
}

void timeline::run(const step_rate& rate) {
  require_idle("run");
  if (!(rate.step_ms > 0)) throw std::logic_error("timeline: a step must take > 0 ms");
  settle_stopped();
  running_ = rate;
}

void timeline::stop() {
  require_idle("stop");
  settle_stopped();
  running_.reset();
}

void timeline::checkpoint_every(int steps, double ms, double durable_after_ms) {
  checkpoint_steps_ = steps;
  checkpoint_ms_ = ms;
  checkpoint_lag_ms_ = durable_after_ms;
  steps_since_durable_ = 0;
}

void timeline::fall_back_to_checkpoint() {
  settle_writes(now_);
  writes_.clear();  // a write still in flight is abandoned with the job
  for (auto it = segments_.rbegin(); it != segments_.rend() && it->end_ms > durable_ms_; ++it) {
    if (it->kind != activity::effective || it->start_ms < durable_ms_) continue;
    it->kind = activity::fallback;
    it->samples = 0;
    it->redundant_ms = 0;
  }
  steps_since_durable_ = 0;
}

void timeline::mark_durable() {
  writes_.clear();
  durable_ms_ = now_;
  split_ms_ = now_;
  steps_since_durable_ = 0;
}

void timeline::advance_to(double t) {
  if (closed_) throw std::logic_error("timeline: advance_to after close()");
  if (t < now_) throw std::logic_error("timeline: time runs backwards");
  while (true) {
    if (!queue_.empty()) {
      const phase p = queue_.front();
      const double end = head_start_ + (p.finish_step ? p.rate.step_ms : p.ms);
      if (end > t) break;
      queue_.pop_front();
      if (p.finish_step) {
        add(head_start_, end, activity::effective, p.rate.samples_per_step, p.rate.redundant_ms, p.rate.nodes);
        ++steps_since_durable_;
      } else {
        add(head_start_, end, p.kind);
        if (p.durable) make_durable(end, p.durable_after);
      }
      head_start_ = end;
      continue;
    }
    if (running_) {
      const auto r = *running_;
      // Whole steps that end by t (a relative tolerance absorbs rounding of long sums).
      auto n = static_cast<long long>(std::floor((t - head_start_) / r.step_ms * (1 + 1e-12)));
      bool checkpoint_due = false;
      if (checkpoint_steps_ > 0) {
        const long long left = checkpoint_steps_ - steps_since_durable_;
        if (n >= left) {
          n = left;
          checkpoint_due = true;
        }
      }
      if (n > 0) {
        const double end = head_start_ + static_cast<double>(n) * r.step_ms;
        add(head_start_, end, activity::effective, static_cast<double>(n) * r.samples_per_step,
            static_cast<double>(n) * r.redundant_ms, r.nodes);
        head_start_ = end;
        steps_since_durable_ += static_cast<int>(n);
      }
      if (checkpoint_due) {
        // The checkpoint runs between steps; training resumes at this rate after it.
        if (checkpoint_ms_ > 0) {
          queue_.push_back(
              {.kind = activity::checkpoint, .ms = checkpoint_ms_, .durable = true, .durable_after = checkpoint_lag_ms_});
        } else {
          make_durable(head_start_, checkpoint_lag_ms_);
        }
        continue;
      }
      break;
    }
    add(head_start_, t, activity::stopped);
    head_start_ = t;
    break;
  }
  now_ = t;
  settle_writes(t);
}

void timeline::close() {
  if (closed_) return;
  if (!queue_.empty()) {
    const auto& p = queue_.front();
    if (p.finish_step) {
      const double frac = (now_ - head_start_) / p.rate.step_ms;
      add(head_start_, now_, activity::effective, frac * p.rate.samples_per_step, frac * p.rate.redundant_ms,
          p.rate.nodes);
    } else {
      add(head_start_, now_, p.kind);
    }
  } else if (running_) {
    const double frac = (now_ - head_start_) / running_->step_ms;
    add(head_start_, now_, activity::effective, frac * running_->samples_per_step, frac * running_->redundant_ms,
        running_->nodes);
  } else {
    add(head_start_, now_, activity::stopped);
  }
  queue_.clear();
  running_.reset();
  closed_ = true;
}

std::array<double, kActivities> timeline::breakdown() const {
  std::array<double, kActivities> out{};
  for (const auto& s : segments_) {
    const double ms = s.end_ms - s.start_ms;
    if (s.kind == activity::effective) {
      out[static_cast<int>(activity::effective)] += ms - s.redundant_ms;
      out[static_cast<int>(activity::redundant)] += s.redundant_ms;
    } else {
      out[static_cast<int>(s.kind)] += ms;
    }
  }
  return out;
}

double timeline::samples() const {
  double n = 0;
  for (const auto& s : segments_) n += s.samples;
  return n;
}

}  // namespace oobleck::sim
