// oobleck-coordinator --metrics-out: a step's line carries the fields the README's "Metrics"
// section lists, the optional ones only when the coordinator knows them.

#include "apps/coordinator_metrics.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

using namespace oobleck;

TEST_CASE("metrics: a step's line has wall_ms, and ideal_ms and predicted_ms only where they are known") {
  actors::step_record r;
  r.step = 7;
  r.epoch = 2;
  r.loss = 3.25;
  r.samples = 16;
  r.wall_ms = 12.5;
  SUBCASE("neither known: a stage without op times, an epoch no plan predicted") {
    const auto j = nlohmann::json::parse(apps::step_json(r));
    CHECK(j["step"] == 7);
    CHECK(j["epoch"] == 2);
    CHECK(j["wall_ms"] == doctest::Approx(12.5));
    CHECK_FALSE(j.contains("ideal_ms"));
    CHECK_FALSE(j.contains("predicted_ms"));
  }
  SUBCASE("both known") {
    r.ideal_ms = 11.25;
    r.predicted_ms = 9.75;
    const auto j = nlohmann::json::parse(apps::step_json(r));
    CHECK(j["ideal_ms"] == doctest::Approx(11.25));
    CHECK(j["predicted_ms"] == doctest::Approx(9.75));
  }
}

TEST_CASE("metrics: every pipeline of a step's line names its nodes in stage order and its stages' layer bounds") {
  actors::step_record r;
  r.pipelines.push_back({{planning::node_id{3}, planning::node_id{0}}, {0, 4, 10}, 3});
  r.pipelines.push_back({{planning::node_id{5}}, {0, 10}, 1});
  const auto j = nlohmann::json::parse(apps::step_json(r));
  REQUIRE(j["pipelines"].size() == 2u);
  CHECK(j["pipelines"][0]["nodes"] == nlohmann::json::array({3, 0}));
  CHECK(j["pipelines"][0]["stage_layers"] == nlohmann::json::array({0, 4, 10}));
  CHECK(j["pipelines"][0]["microbatches"] == 3);
  CHECK(j["pipelines"][1]["nodes"] == nlohmann::json::array({5}));
  CHECK(j["pipelines"][1]["stage_layers"] == nlohmann::json::array({0, 10}));
}
