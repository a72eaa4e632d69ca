#include "apps/run_history.hpp"

#include <cmath>

namespace oobleck::apps {

namespace {

/// JSON has no NaN or infinity: a loss that is not finite is null (the dashboard leaves a gap).
nlohmann::ordered_json number(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); }

nlohmann::ordered_json step_json(const history_step& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["epoch"] = s.epoch;
  j["loss"] = number(s.loss);
  j["samples_per_second"] = number(s.samples_per_second);
  j["step_ms"] = number(s.step_ms);
  j["unix_ms"] = s.unix_ms;
  return j;
}

}  // namespace

run_history::run_history(std::size_t max_points) : max_(max_points < 2 ? 2 : max_points), steps_(max_), evals_(max_) {}

void run_history::add_step(const history_step& s) {
  std::lock_guard lock(mutex_);
  steps_.add(s);
  last_step_ = s;
}

void run_history::add_eval(const history_eval& e) {
  std::lock_guard lock(mutex_);
  evals_.add(e);
}

void run_history::add_reconfiguration(const history_reconfiguration& r) {
  std::lock_guard lock(mutex_);
  if (reconfigurations_.size() == max_) {
    reconfigurations_.erase(reconfigurations_.begin());
    ++reconfigurations_dropped_;
  }
  reconfigurations_.push_back(r);
}

nlohmann::ordered_json run_history::json() const {
  // A copy under the lock, the JSON built outside it: the coordinator's thread that adds the next
  // step waits for a copy of plain structs only.
  std::unique_lock lock(mutex_);
  const auto steps_kept = steps_.points();
  const auto evals_kept = evals_.points();
  const auto reconfigurations_kept = reconfigurations_;
  const auto last = last_step_;
  const auto steps_seen = steps_.offered(), step_stride = steps_.stride();
  const auto evals_seen = evals_.offered(), eval_stride = evals_.stride();
  const auto dropped = reconfigurations_dropped_;
  lock.unlock();
  nlohmann::ordered_json j;
  j["max_points"] = max_;
  j["steps_seen"] = steps_seen;
  j["step_stride"] = step_stride;
  j["last_step"] = last ? step_json(*last) : nlohmann::ordered_json();
  auto& steps = j["steps"] = nlohmann::ordered_json::array();
  for (const auto& s : steps_kept) steps.push_back(step_json(s));
  j["evals_seen"] = evals_seen;
  j["eval_stride"] = eval_stride;
  auto& evals = j["evals"] = nlohmann::ordered_json::array();
  for (const auto& e : evals_kept) {
    nlohmann::ordered_json p;
    p["step"] = e.step;
    p["loss"] = number(e.loss);
    p["windows"] = e.windows;
    p["unix_ms"] = e.unix_ms;
    evals.push_back(std::move(p));
  }
  j["reconfigurations_dropped"] = dropped;
  auto& reconfigurations = j["reconfigurations"] = nlohmann::ordered_json::array();
  for (const auto& r : reconfigurations_kept) {
    nlohmann::ordered_json p;
    p["step"] = r.step;
    p["epoch"] = r.epoch;
    p["action"] = r.action;
    p["lost"] = r.lost;
    p["joined"] = r.joined;
    p["downtime_ms"] = number(r.downtime_ms);
    p["unix_ms"] = r.unix_ms;
    reconfigurations.push_back(std::move(p));
  }
  return j;
}

}  // namespace oobleck::apps
