// Recovery end to end, each path of the reconfiguration policy (checks: recovery_e2e_support.hpp):
// a single worker killed in the middle of a step, chosen so that the policy answers with simple
// re-instantiation, borrow or merge; f = 2 with two nodes killed in the same step; and a second
// node killed in the step after the first recovery.

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/recovery_e2e_support.hpp"

using namespace oobleck;
using namespace oobleck::testing;

namespace {

/// The single victim whose loss takes exactly `rules`, with layer copies.
std::optional<int> victim_for(const planner_model& planner, int nodes, const std::string& rules) {
  for (int v = 0; v < nodes; ++v) {
    const auto r = planner.lose(planner.initial(), {v});
    if (continues(r) && r.reason == rules && !r.copies.empty()) return v;
  }
  return std::nullopt;
}

/// One node killed in the middle of step 3 of 6, chosen so that the policy answers with exactly
/// `rules`; checked in full, and the loss taken with those rules, published and recorded once.
checked_run run_single_loss(const job_case& c, const std::string& rules) {
  const planner_model planner(c);
  const auto v = victim_for(planner, c.nodes, rules);
  REQUIRE(v);
  MESSAGE(rules << ": " << describe(planner.initial()) << "- node " << *v << " -> "
                << describe(planner_model::after(planner.lose(planner.initial(), {*v}))));
  constexpr int steps = 6;
  auto run = run_faults(c, steps, {"--fail-at", "3:" + std::to_string(*v)}, {*v});
  const auto& [r, s] = run;
  REQUIRE(!s.losses.empty());
  CHECK(s.losses.back().rules == rules);
  CHECK(s.losses.back().lost == std::vector<int>{*v});
  REQUIRE(r.records.size() == 1);
  CHECK(r.records[0]["action"] == rules);
  CHECK(r.records[0]["resumed_step"] == 3);
  return run;
}

}  // namespace

TEST_CASE("recovery e2e: a single loss that the policy answers with simple re-instantiation") {
  // 6 nodes, 2 pipelines of 3 (n0 = 2): a pipeline that keeps 2 nodes runs the 2-node template.
  run_single_loss(make_job(6, 1, 1'500'000), "simple");
}

TEST_CASE("recovery e2e: a loss that forces borrow: the shrunken pipeline takes a node from a larger one") {
  // 5 nodes: pipelines of 3 and 2 (n0 = 2). A node of the 2-node pipeline dies: 1 node is left,
  // below n0, and the 3-node pipeline can spare one (it still has a 2-node template).
  const auto run = run_single_loss(make_job(5, 1, 1'500'000), "borrow");
  CHECK(run.result.records.at(0)["copy_bytes"].get<std::int64_t>() > 0);
}

TEST_CASE("recovery e2e: a loss that forces merge: no pipeline can spare a node, the survivor joins another") {
  // 6 nodes with less slot memory: 3 pipelines of 2 (n0 = 2), none can give a node away; the
  // survivor of the broken one is merged into another, which becomes a 3-node pipeline.
  run_single_loss(make_job(6, 1, 1'000'000), "merge");
}

TEST_CASE("recovery e2e: f = 2: two nodes of different pipelines killed in the same step") {
  // 8 nodes, f = 2: 4 pipelines of 2. Two nodes of two different pipelines kill themselves in
  // the middle of step 3. Whether the coordinator sees both losses before the new epoch forms
  // (one reconfiguration, both lost) or the second node dies in the re-run of step 3 (two), the
  // policy must survive both ways, and the checks replay whichever happened.
  const auto c = make_job(8, 2, 1'500'000);
  const planner_model planner(c);
  const auto start = planner.initial();
  REQUIRE(start.pipelines.size() >= 3);
  std::optional<std::pair<int, int>> pick;
  for (int a = 0; a < c.nodes && !pick; ++a)
    for (int b = a + 1; b < c.nodes && !pick; ++b) {
      if (pipeline_of(start, a) == pipeline_of(start, b)) continue;
      const auto both = planner.lose(start, {a, b});
      const auto first_a = planner.lose(start, {a});
      const auto first_b = planner.lose(start, {b});
      if (continues(both) && continues(first_a) && continues(first_b) &&
          continues(planner.lose(planner_model::after(first_a), {b})) &&
          continues(planner.lose(planner_model::after(first_b), {a})) && !both.copies.empty())
        pick = std::pair{a, b};
    }
  REQUIRE(pick);
  const auto [a, b] = *pick;
  MESSAGE("f = 2: " << describe(start) << "- nodes " << a << ", " << b << " -> "
                    << describe(planner_model::after(planner.lose(start, {a, b}))) << "("
                    << planner.lose(start, {a, b}).reason << ")");
  constexpr int steps = 6;
  const auto [r, s] = run_faults(c, steps, {"--fail-at", "3:" + ids_list({a, b})}, {a, b});
  for (const auto& lr : s.losses) MESSAGE("reconfigured after losing " << ids_list(lr.lost) << ": " << lr.rules);
  for (const auto& m : r.steps) CHECK(m["pipelines"].size() >= 3u);  // f + 1 pipelines throughout
}

TEST_CASE("recovery e2e: two losses in a row: a second node dies in the step after the first recovery") {
  // 6 nodes: one node of a 3-node pipeline dies in step 3 (simple: it runs the 2-node template),
  // then one of the remaining two in step 4 (now below n0: borrow from the other pipeline).
  const auto c = make_job(6, 1, 1'500'000);
  const planner_model planner(c);
  std::optional<std::pair<int, int>> pick;
  for (int a = 0; a < c.nodes && !pick; ++a) {
    const auto first = planner.lose(planner.initial(), {a});
    if (!continues(first) || first.reason != "simple") continue;
    for (int b = 0; b < c.nodes && !pick; ++b) {
      if (b == a) continue;
      const auto second = planner.lose(planner_model::after(first), {b});
      if (continues(second) && second.reason == "borrow") pick = std::pair{a, b};
    }
  }
  REQUIRE(pick);
  const auto [a, b] = *pick;
  constexpr int steps = 7;
  const auto [r, s] =
      run_faults(c, steps, {"--fail-at", "3:" + std::to_string(a), "--fail-at", "4:" + std::to_string(b)}, {a, b});
  REQUIRE(s.losses.size() >= 2);
  CHECK(s.losses.front().lost == std::vector<int>{a});
  CHECK(s.losses.front().rules == "simple");
  CHECK(s.losses.back().lost == std::vector<int>{b});
  CHECK(s.losses.back().rules == "borrow");
  REQUIRE(r.records.size() == 2);  // two recoveries, each ended by a commit
  CHECK(r.records[0]["resumed_step"] == 3);
  CHECK(r.records[1]["resumed_step"] == 4);
}
