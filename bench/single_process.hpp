#pragma once
// The benchmarks' baseline (bench/throughput, bench/vs_pytorch): the single process (one LibTorch thread, every layer, the whole
// batch: actors::train_single_process), alone and as several copies side by side.

#include <filesystem>
#include <string>
#include <vector>

namespace oobleck::actors {
struct stage_job;
}

namespace oobleck::bench {

/// Mean step time of the single-process run: (time of warmup + steps) - (time of warmup), per step.
double single_process_step_ms(const actors::stage_job& job, int warmup, int steps);

/// One of the single processes run side by side (the benchmark's program started with JOB WARMUP
/// STEPS): loads the model and trains `warmup` steps, says "ready" on stdout, waits for the
/// benchmark to close descriptor 3 (every copy is ready by then), then measures as
/// single_process_step_ms and prints "step_ms X". Its exit status.
int side_by_side_child(const std::vector<std::string>& words);

/// The single process's step time when `copies` of it train at once, each its own process (this
/// program, `--side-by-side-child`), as the cluster's workers compute at once: each copy's mean
/// step (started together: the copies wait for one another to be loaded and warm). On a machine
/// whose cores slow one another (shared caches, memory bandwidth, a hypervisor's placement), this
/// is above the single process's time alone, and no pipeline of `copies` nodes here can compute
/// faster than it. Their logs go to `dir`; throws std::runtime_error with a failed copy's log.
std::vector<double> side_by_side_step_ms(const std::filesystem::path& dir, const std::filesystem::path& job, int copies,
                                         int warmup, int steps);

}  // namespace oobleck::bench
