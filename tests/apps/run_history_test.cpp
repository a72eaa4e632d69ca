// The run's history behind GET /history: what it keeps of steps, evaluations and reconfigurations,
// and how it stays bounded over a run of any length.

#include "apps/run_history.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <thread>

using namespace oobleck::apps;

namespace {

history_step step(std::uint64_t k) {
  return {k, 1 + k / 100, 5.0 / static_cast<double>(k + 1), 100.0 + static_cast<double>(k), 10.0, 1.7e12 + static_cast<double>(k)};
}

}  // namespace

TEST_CASE("run history: every step, eval and reconfiguration while under the bound, as JSON") {
  run_history h(100);
  for (std::uint64_t k = 0; k < 7; ++k) h.add_step(step(k));
  h.add_eval({4, 2.5, 8, 1.7e12});
  h.add_reconfiguration({5, 2, "borrow+merge", {3}, {}, 1234.5, 1.8e12});
  const auto j = h.json();
  CHECK(j["max_points"] == 100);
  CHECK(j["steps_seen"] == 7);
  CHECK(j["step_stride"] == 1);
  REQUIRE(j["steps"].size() == 7);
  for (std::uint64_t k = 0; k < 7; ++k) {
    CAPTURE(k);
    const auto& s = j["steps"][k];
    CHECK(s["step"] == k);
    CHECK(s["epoch"] == 1);
    CHECK(s["loss"].get<double>() == doctest::Approx(5.0 / static_cast<double>(k + 1)));
    CHECK(s["samples_per_second"].get<double>() == doctest::Approx(100.0 + static_cast<double>(k)));
    CHECK(s["step_ms"] == 10.0);
  }
  CHECK(j["last_step"] == j["steps"][6]);
  REQUIRE(j["evals"].size() == 1);
  CHECK(j["evals"][0]["step"] == 4);
  CHECK(j["evals"][0]["loss"] == 2.5);
  CHECK(j["evals"][0]["windows"] == 8);
  REQUIRE(j["reconfigurations"].size() == 1);
  const auto& r = j["reconfigurations"][0];
  CHECK(r["step"] == 5);
  CHECK(r["epoch"] == 2);
  CHECK(r["action"] == "borrow+merge");
  CHECK(r["lost"] == nlohmann::json::array({3}));
  CHECK(r["joined"] == nlohmann::json::array());
  CHECK(r["downtime_ms"] == 1234.5);
  CHECK(j["reconfigurations_dropped"] == 0);
}

TEST_CASE("run history: an empty run, and a loss that is not a number, are valid JSON") {
  run_history h;
  auto j = h.json();
  CHECK(j["steps"].empty());
  CHECK(j["last_step"].is_null());
  CHECK(j["evals"].empty());
  h.add_step({0, 1, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), 0, 0});
  j = h.json();
  CHECK(j["steps"][0]["loss"].is_null());
  CHECK(j["steps"][0]["samples_per_second"].is_null());
  CHECK(nlohmann::json::accept(j.dump()));
}

TEST_CASE("run history: a long run keeps at most max_points steps, evenly spread from the first, and the newest") {
  for (std::size_t max : {2, 3, 10, 64}) {
    for (std::uint64_t total : {1ull, 9ull, 10ull, 11ull, 100ull, 1000ull, 4321ull}) {
      CAPTURE(max);
      CAPTURE(total);
      run_history h(max);
      for (std::uint64_t k = 0; k < total; ++k) h.add_step(step(k));
      const auto j = h.json();
      const auto& steps = j["steps"];
      CHECK(steps.size() <= max);
      CHECK(steps.size() >= std::min<std::uint64_t>(total, max / 2));
      CHECK(j["steps_seen"] == total);
      CHECK(j["last_step"]["step"] == total - 1);
      const auto stride = j["step_stride"].get<std::uint64_t>();
      CHECK((stride & (stride - 1)) == 0);  // a power of two
      for (std::size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"] == i * stride);
      // Nothing kept is older than a stride behind the newest offered.
      CHECK(steps.back()["step"].get<std::uint64_t>() + stride > total - 1);
    }
  }
}

TEST_CASE("run history: evaluations thin out like steps, reconfigurations keep the newest") {
  run_history h(4);
  for (std::uint64_t k = 0; k < 9; ++k) h.add_eval({k * 10, 1.0, 2, 0});
  auto j = h.json();
  CHECK(j["evals_seen"] == 9);
  CHECK(j["eval_stride"] == 4);
  REQUIRE(j["evals"].size() == 3);
  CHECK(j["evals"][2]["step"] == 80);
  for (std::uint64_t k = 0; k < 6; ++k) h.add_reconfiguration({k, k + 1, "simple", {}, {}, 0, 0});
  j = h.json();
  REQUIRE(j["reconfigurations"].size() == 4);
  CHECK(j["reconfigurations"][0]["step"] == 2);
  CHECK(j["reconfigurations"][3]["step"] == 5);
  CHECK(j["reconfigurations_dropped"] == 2);
}

TEST_CASE("run history: added to from one thread while read from another") {
  run_history h(50);
  std::thread writer([&] {
    for (std::uint64_t k = 0; k < 5000; ++k) h.add_step(step(k));
  });
  std::size_t reads = 0;
  for (; reads < 200; ++reads) {
    const auto j = h.json();
    CHECK(j["steps"].size() <= 50);
  }
  writer.join();
  CHECK(h.json()["steps_seen"] == 5000);
}
