#include "planning/cost_model.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace oobleck::planning;

namespace {

profile two_width_profile() {
  profile p;
  p.model = "toy";
  p.microbatch_size = 1;
  p.gpus_per_node = 2;
  p.device_memory_bytes = 1000;
  // layer: fwd{1,2}, bwd{1,2}, params, activations
  p.layers = {{"a", {1, 0.5}, {2, 1}, 10, 100},
              {"b", {3, 2}, {6, 4}, 20, 50},
              {"c", {1, 1}, {1, 1}, 5, 10}};
  return p;
}

}  // namespace

TEST_CASE("stage latency sums forward and backward of the stage's layers at its width") {
  const layer_costs costs(two_width_profile(), {1000, 4.0});
  CHECK(costs.stage_ms(layer_index{0}, layer_index{1}, 1) == 3.0);
  CHECK(costs.stage_ms(layer_index{0}, layer_index{2}, 1) == 12.0);
  CHECK(costs.stage_ms(layer_index{0}, layer_index{3}, 2) == 1.5 + 6 + 2);
  CHECK(costs.stage_ms(layer_index{1}, layer_index{3}, 2) == 6 + 2);
}

TEST_CASE("memory: state/d + (S-k) * activations/d against device memory") {
  // Layers 0..1: state = (10 + 20) * 4 = 120 bytes, activations 150 bytes per microbatch.
  const layer_costs costs(two_width_profile(), {1000, 4.0});
  CHECK(costs.stage_fits(layer_index{0}, layer_index{2}, 1, 5));   // 120 + 5 * 150 = 870
  CHECK(!costs.stage_fits(layer_index{0}, layer_index{2}, 1, 6));  // 120 + 6 * 150 = 1020
  CHECK(costs.stage_fits(layer_index{0}, layer_index{2}, 2, 12));  // (120 + 12 * 150) / 2 = 960
  CHECK(!costs.stage_fits(layer_index{0}, layer_index{2}, 2, 13)); // (120 + 13 * 150) / 2 = 1035
  // The state factor is configurable: with 8, state = 240, so 4 in flight is 840 and 6 is 1140.
  const layer_costs heavy(two_width_profile(), {1000, 8.0});
  CHECK(heavy.stage_fits(layer_index{0}, layer_index{2}, 1, 5));   // 240 + 750 = 990
  CHECK(!heavy.stage_fits(layer_index{0}, layer_index{2}, 1, 6));
}

TEST_CASE("T(Nb) for one stage is Nb * w") {
  const std::vector<double> w{5};
  CHECK(iteration_time(w, 1) == 5);
  CHECK(iteration_time(w, 7) == 35);
  CHECK(ranking_time(w) == 20);
}

TEST_CASE("T(Nb) for S equal stages is the 1F1B makespan (Nb + S - 1) w") {
  const std::vector<double> w{2, 2, 2, 2};
  CHECK(iteration_time(w, 16) == (16 + 4 - 1) * 2);
  CHECK(iteration_time(w, 5) == (5 + 4 - 1) * 2);
}

TEST_CASE("k* is the last stage of maximal latency") {
  CHECK(bottleneck_stage(std::vector<double>{3, 1, 3, 2}) == 2);
  CHECK(bottleneck_stage(std::vector<double>{4, 1, 3, 2}) == 0);
  CHECK(bottleneck_stage(std::vector<double>{1, 2, 3, 3}) == 3);
}

TEST_CASE("T(Nb) follows the DESIGN formula with the suffix after the bottleneck") {
  // w = {1, 4, 2, 4, 3}: S = 5, k* = 3, w* = 4, sum = 14, suffix sum from k* = 7.
  const std::vector<double> w{1, 4, 2, 4, 3};
  // T(Nb) = 14 + (Nb - 5 + 3 - 1) * 4 + 7
  CHECK(iteration_time(w, 20) == 14 + (20 - 5 + 3 - 1) * 4 + 7);
  CHECK(ranking_time(w) == 14 + (3 * 5 + 3 - 1) * 4 + 7);
}

TEST_CASE("the step's synchronisation: a ring all-reduce per layer over its holders, then AdamW") {
  auto p = two_width_profile();  // param bytes 10, 20, 5
  p.layers[0].optimizer_ms = 0.5;
  p.layers[1].optimizer_ms = 1.25;
  p.layers[2].optimizer_ms = 0.25;
  const layer_costs free_link(p, {1000, 4.0});
  CHECK(free_link.allreduce_ms(layer_index{0}, layer_index{3}, 4) == 0);  // no link in the profile: communication is free
  CHECK(free_link.optimizer_ms(layer_index{0}, layer_index{3}) == 2.0);
  CHECK(free_link.optimizer_ms(layer_index{1}, layer_index{2}) == 1.25);
  p.link = {0.5, 2.0};  // 0.5 ms + 2 bytes per ms
  const layer_costs costs(p, {1000, 4.0});
  CHECK(costs.allreduce_ms(layer_index{0}, layer_index{3}, 1) == 0);  // one holder: nothing to reduce
  // 2 holders: 2 messages of half the layer: layer a 2 * (0.5 + 5/2), b 2 * (0.5 + 10/2), c 2 * (0.5 + 3/2) (ceil).
  CHECK(costs.allreduce_ms(layer_index{0}, layer_index{3}, 2) == doctest::Approx(6.0 + 11.0 + 4.0));
  // 3 holders: 4 messages of a third (rounded up): 4 (0.5 + 4/2) + 4 (0.5 + 7/2) + 4 (0.5 + 2/2).
  CHECK(costs.allreduce_ms(layer_index{0}, layer_index{3}, 3) == doctest::Approx(10.0 + 16.0 + 6.0));
}
