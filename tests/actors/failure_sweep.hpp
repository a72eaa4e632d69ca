#pragma once
// The failure sweeps' shared parts (failure_sweep_protocol_test.cpp: nodes lost, hung, failing or
// joining; coordinator_loss_sweep_protocol_test.cpp: the coordinator cut off or replaced), on the
// protocol fixture (protocol_fixture.hpp): where in a step a failure lands, how a fake stage is
// held there, and what must hold of the job's accounting however the failures went.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/protocol_fixture.hpp"

namespace oobleck::testing {

/// Where the victims die: while step `step` of epoch 1 runs (their stages hold its answer), while
/// its commit is applied (they hold the commit), or while the periodic checkpoint before it is
/// written (they hold their writes).
struct failure_point {
  enum kind_t { step_runs, commit_applied, checkpoint_written, first_forming } kind = step_runs;
  std::uint64_t step = 1;
};

/// The coordinator's phase while the job stands at a point of that kind.
const char* state_of(failure_point::kind_t k);

/// A stage that holds its answer at `point` (and never gives it).
void hold_at(fake_stage_record& r, const failure_point& point);

/// A held stage answers again from now on (what it held stays unanswered).
void release(fake_stage_record& r);

/// Node setups in which each of `victims` holds its answer at `point`, after what `also` sets up
/// for it (the other nodes keep `also`'s).
fixture::setup_map holding(const std::vector<std::int64_t>& victims, failure_point point, fixture::setup_map also = {});

/// A case's name: the victims, the point and the job's options that differ between cases.
std::string case_name(const std::vector<std::int64_t>& victims, const failure_point& p, const fixture::options& o);

/// The failure points: the first epoch forming, then steps 0 .. steps - 2 (and the checkpoints
/// before them, when periodic).
std::vector<failure_point> points(std::uint64_t steps, std::uint64_t every);

/// Every non-empty set of at most `most` of the nodes 0 .. nodes - 1.
std::vector<std::vector<std::int64_t>> victim_sets(int nodes, int most);

/// The jobs of the sweeps' variants: six and four nodes, 4 steps, a checkpoint every 2, without
/// run-ahead (one slot or two) and with it on nodes of two slots (with it on one slot is the
/// sweeps' own job).
std::vector<fixture::options> variant_jobs();

/// Whether the job stands at `point` for `victims` once started: false when the point does not
/// arise (a periodic checkpoint that asks nothing of any of them: the job went on past it, another
/// case); otherwise the coordinator is in the point's phase (required).
bool stands_at(fixture& f, const std::vector<std::int64_t>& victims, failure_point point);

/// Starts the job's workers, each looking for a coordinator when it loses its own, with node
/// `held`'s stage holding its answer at `point`, and runs it there; false when the point does not
/// arise (stands_at).
bool start_held(fixture& f, std::int64_t held, failure_point point);

/// Simulated time passes a second at a time (deadlines fire, nodes look for a coordinator again)
/// until the job stops, for at most 15 minutes of it; `each` runs after every second.
void run_until_stopped(fixture& f, const std::function<void()>& each = {});

/// What must hold however the failures went: every step committed once, in order, from 0
/// (records and events alike); at most `stood_at_most` commits stood through a loss; each
/// checkpoint holds the state after the steps committed before it; the job ended once, finished
/// with every step or stopped by the policy (or, `may_fail`, by failures in a row) counting what
/// was committed; evaluation rounds once each.
void check_accounting(const fixture& f, std::uint64_t steps, std::size_t stood_at_most, bool may_fail = false);

/// The accounting of a job that may resume from a checkpoint older than its last commit (the
/// steps after it run again): each committed step is the one after the previous commit, or the
/// step of the checkpoint the job just resumed from; each checkpoint holds the state the next step
/// starts from; a finished job committed its last step.
void check_resumed_accounting(const fixture& f, std::uint64_t steps);

}  // namespace oobleck::testing
