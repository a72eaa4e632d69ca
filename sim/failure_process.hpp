#pragma once
// Failures drawn from a documented random process instead of a trace (issue 27): every node of
// the cluster fails independently after an exponentially distributed time, and optionally comes
// back (as a new node: ids are never reused) a fixed repair time later.
//
// Rate. The parameter is the job's mean time to failure (MTTF): the mean time between failures
// of its N nodes together, so that each node fails at rate 1 / (N x MTTF). Spare nodes (beyond
// the N the job uses) fail at the same per-node rate. Without a given MTTF, default_mttf_h()
// interpolates the two figures Meta reports for its research clusters (Kokolis et al.,
// "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", HPCA 2025): 7.9 h
// at 1,024 GPUs and 1.8 h at 16,384 GPUs, log-linearly in the GPU count (MTTF = 7.9 h x
// (G / 1024)^-0.533, 3.8 h at 4,096 GPUs; outside [1024, 16384] the same line extended).
//
// Sampling. The next failure of the cluster is exponential with the sum of the alive nodes'
// rates, and the failing node is uniform among them (the superposition of independent
// exponential clocks), so a run costs O(failures), not O(nodes x time). Uniform draws come from
// std::mt19937_64 (the same numbers on every standard library) turned into exponentials by
// -log(1 - u) with u from 53 bits, so a seed gives the same failures everywhere.

#include <cstdint>
#include <string>

#include "sim/trace.hpp"

namespace oobleck::sim {

struct failure_process {
  int nodes = 0;         ///< N: the job's nodes (the MTTF is theirs)
  int spare_nodes = 0;   ///< ready from the start beyond N, failing at the same per-node rate
  double mttf_h = 0;     ///< the job's MTTF in hours (> 0)
  double repair_h = 0;   ///< a failed node comes back (as a new node) this long after; 0: never
  double duration_h = 0; ///< failures drawn in [0, duration)
  std::uint64_t seed = 1;
};

/// Meta's MTTF for a job of `gpus` GPUs (hours), as above.
double default_mttf_h(double gpus);

/// The cluster a job sees: at time 0 nodes 0 .. N + spares - 1 ready; then at each failure the
/// node removed, and at each repair a new node ready. messages::input_error on bad parameters.
cluster_trace generate_failures(const failure_process& p);

/// One line for reports: "exponential per node, MTTF 1.80 h (N nodes), repair 2.00 h, seed 1".
std::string describe(const failure_process& p);

}  // namespace oobleck::sim
