#include "actors/failure_sweep.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <utility>

namespace oobleck::testing {

using messages::event_kind;
using messages::stop_outcome;

const char* state_of(failure_point::kind_t k) {
  switch (k) {
    case failure_point::step_runs: return "training";
    case failure_point::commit_applied: return "committing";
    case failure_point::checkpoint_written: return "checkpointing";
    case failure_point::first_forming: return "forming";
  }
  return "?";
}

void hold_at(fake_stage_record& r, const failure_point& point) {
  if (point.kind == failure_point::commit_applied)
    r.hold_commit = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
  else if (point.kind == failure_point::step_runs)
    r.hold_step = std::pair<std::uint64_t, std::uint64_t>{1, point.step};
  else if (point.kind == failure_point::first_forming)
    r.hold_form = {1};
  else
    r.hold_write = true;
}

std::string case_name(const std::vector<std::int64_t>& victims, const failure_point& p, const fixture::options& o) {
  std::string out = "victims";
  for (auto v : victims) out += " " + std::to_string(v);
  const std::string job = std::to_string(o.nodes) + " nodes, checkpoint every " + std::to_string(o.checkpoint_every) +
                          (o.run_ahead ? "" : ", without run-ahead") +
                          (o.slots > 1 ? ", " + std::to_string(o.slots) + " slots" : "") +
                          (o.digest_every > 1 ? ", digests every " + std::to_string(o.digest_every) : "");
  if (p.kind == failure_point::first_forming) return out + ", forming the first epoch; " + job;
  const char* where = p.kind == failure_point::step_runs        ? ", during step "
                      : p.kind == failure_point::commit_applied ? ", during the commit of step "
                                                                : ", writing the checkpoint before step ";
  return out + where + std::to_string(p.step) + "; " + job;
}

std::vector<failure_point> points(std::uint64_t steps, std::uint64_t every) {
  std::vector<failure_point> out{{failure_point::first_forming, 0}};
  for (std::uint64_t k = 0; k + 1 < steps; ++k) {
    out.push_back({failure_point::step_runs, k});
    out.push_back({failure_point::commit_applied, k});
    if (every > 0 && k > 0 && k % every == 0) out.push_back({failure_point::checkpoint_written, k});
  }
  return out;
}

std::vector<std::vector<std::int64_t>> victim_sets(int nodes, int most) {
  std::vector<std::vector<std::int64_t>> out;
  for (unsigned mask = 1; mask < (1u << nodes); ++mask) {
    std::vector<std::int64_t> set;
    for (int n = 0; n < nodes; ++n)
      if (mask & (1u << n)) set.push_back(n);
    if (static_cast<int>(set.size()) <= most) out.push_back(set);
  }
  return out;
}

std::vector<fixture::options> variant_jobs() {
  std::vector<fixture::options> out;
  for (int nodes : {6, 4})
    for (const bool run_ahead : {false, true})
      for (const int slots : {1, 2})
        if (!run_ahead || slots > 1)
          out.push_back({.nodes = nodes, .steps = 4, .slots = slots, .checkpoint_every = 2, .run_ahead = run_ahead});
  return out;
}

fixture::setup_map holding(const std::vector<std::int64_t>& victims, failure_point point, fixture::setup_map also) {
  fixture::setup_map setup = also;
  for (auto v : victims)
    setup[v] = [point, before = also.count(v) ? also.at(v) : nullptr](fake_stage_record& r) {
      if (before) before(r);
      hold_at(r, point);
    };
  return setup;
}

void release(fake_stage_record& r) {
  r.hold_step.reset();
  r.hold_commit.reset();
  r.hold_write = false;
  r.hold_form.clear();
}

bool stands_at(fixture& f, const std::vector<std::int64_t>& victims, failure_point point) {
  if (point.kind == failure_point::checkpoint_written) {
    bool asked = false;
    for (auto v : victims) asked = asked || f.stages.at(v)->traced("write " + std::to_string(point.step));
    if (!asked) return false;
  }
  REQUIRE(f.status().state == state_of(point.kind));
  return true;
}

bool start_held(fixture& f, std::int64_t held, failure_point point) {
  const auto hold = [held, point](fake_stage_record& r) {
    if (r.node == held) hold_at(r, point);
  };
  for (int i = 0; i < f.opts.nodes; ++i)
    f.add_worker({.name = "w" + std::to_string(i), .setup = hold, .slots = f.opts.slots, .finds_coordinator = true});
  f.sched.run();
  return stands_at(f, {held}, point);
}

void run_until_stopped(fixture& f, const std::function<void()>& each) {
  for (int seconds = 0; seconds < 900 && !f.happened({.kind = event_kind::stopped}); ++seconds) {
    f.sched.advance_time(std::chrono::seconds(1));
    f.sched.run();
    if (each) each();
  }
  INFO(describe(f.events));
  REQUIRE(f.happened({.kind = event_kind::stopped}));
}

void check_accounting(const fixture& f, std::uint64_t steps, std::size_t stood_at_most, bool may_fail) {
  INFO(describe(f.events));
  // Every step committed once, in order, from 0 (records and events alike).
  const auto committed = all_of(f.events, {.kind = event_kind::step_committed});
  REQUIRE(committed.size() == f.records.size());
  for (std::size_t k = 0; k < f.records.size(); ++k) {
    CAPTURE(k);
    CHECK(f.records[k].step == k);
    CHECK(committed[k].step == k);
    CHECK(f.records[k].samples == f.job.global_batch);
  }
  // A commit decided before a loss stands, once.
  CHECK(count(f.events, {.kind = event_kind::commit_stood}) <= stood_at_most);
  // Each checkpoint holds the state after the steps committed before it: its step is their count.
  const auto written = all_of(f.events, {.kind = event_kind::checkpoint_written});
  REQUIRE(written.size() == f.finished.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CAPTURE(i);
    const auto at = position(f.events, {.kind = event_kind::checkpoint_written, .step = written[i].step});
    std::uint64_t before = 0;
    for (std::size_t j = 0; j < at; ++j) before += f.events[j].kind == event_kind::step_committed ? 1 : 0;
    CHECK(written[i].step == before);
    CHECK(f.finished[i].first == before);
  }
  // The job ended once, counting what was committed: finished with every step, or stopped by
  // the policy (its checkpoint, when written, is of the step after the last committed).
  const auto& stop = f.stop();
  CHECK(stop.committed == f.records.size());
  if (stop.outcome == stop_outcome::finished) {
    CHECK(f.records.size() == steps);
  } else {
    // The policy's stop, or (with injected stage errors) failures in a row without a loss.
    CHECK((stop.outcome == stop_outcome::checkpoint_and_stop || (may_fail && stop.outcome == stop_outcome::failed)));
    if (stop.outcome == stop_outcome::checkpoint_and_stop) {
      REQUIRE(f.stops.size() == 1u);
      if (f.stops[0].dir) CHECK(f.stops[0].step == f.records.size());
    }
  }
  // Evaluation rounds, when the job has them: each recorded once, after a committed step.
  for (std::size_t i = 0; i < f.evals.size(); ++i) {
    CAPTURE(i);
    CHECK(f.evals[i].step < f.records.size());
    if (i > 0) CHECK(f.evals[i].step > f.evals[i - 1].step);
  }
}

void check_resumed_accounting(const fixture& f, std::uint64_t steps) {
  INFO(describe(f.events));
  std::uint64_t next = 0;
  std::size_t resumes = 0;
  for (const auto& e : f.events) {
    CAPTURE(describe(e));
    if (e.kind == event_kind::step_committed) {
      CHECK(e.step == next);
      next = e.step + 1;
    } else if (e.kind == event_kind::resumed) {
      REQUIRE(resumes < f.resumes.size());
      const auto& r = f.resumes[resumes++];
      if (r.source == "checkpoint") {
        CHECK(r.step <= next);
        next = r.step;
      } else {
        CHECK(r.step == next);  // from memory: the committed state
      }
    } else if (e.kind == event_kind::checkpoint_written) {
      CHECK(e.step == next);
    }
  }
  CHECK(resumes == f.resumes.size());
  const auto& stop = f.stop();
  if (stop.outcome == stop_outcome::finished) CHECK(next == steps);
  for (std::size_t k = 0; k < f.records.size(); ++k) CHECK(f.records[k].samples == f.job.global_batch);
}

}  // namespace oobleck::testing
