// The NCCL communicator's epoch costs that one GPU can show (issue 28, "Measured on the device"),
// built only in a CUDA build (scripts/gpu/test.sh runs bench/gpu_*):
//   creation   a world communicator of one rank from a fresh unique id, until ready: what every
//              epoch pays on each rank before its groups and links (a 1-rank world makes none);
//   abort      a world of 2 whose peer never joins (the join pending, as after a peer's crash
//              during an epoch's formation): the time from abort() to the waiting thread's
//              comm_error, with abort() called after --pending-ms;
//   after      a communicator created after the abort works (a 1-rank all-reduce of 1 MiB).
// An operation pending on a peer that died mid-transfer, link and group creation, and layer
// copies over NCCL need 2 GPUs (NCCL takes one rank per GPU): not measurable on one.
//
// usage: gpu_nccl [--quick] [--repeats N] [--pending-ms MS] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench/bench_flags.hpp"
#include "runtime/communicator.hpp"
#include "runtime/nccl_communicator.hpp"

using namespace oobleck;
using runtime::nccl_communicator;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int repeats = 10, pending_ms = 200;
  std::string json_path = "gpu_nccl.json";
  oobleck::bench::flag_set app{
      "gpu_nccl: a 1-rank NCCL world's creation time and the abort of a pending join, on GPU 0", "gpu_nccl"};
  app.add_switch("--quick", quick, "3 repeats (a smoke run)");
  app.add_integer("--repeats", repeats, 1, 1000, "timed repeats of each measurement (default 10)");
  app.add_integer("--pending-ms", pending_ms, 0, 60'000, "how long the join is pending before abort() (default 200)");
  app.add_text("--json", json_path, "write the results to PATH (default gpu_nccl.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  if (quick) repeats = 3;
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 1) {
    std::fprintf(stderr, "error: gpu_nccl needs a GPU (none visible)\n");
    return 1;
  }

  std::vector<double> create_ms, abort_ms, waited_ms;
  bool after_ok = true;
  {  // warm-up: NCCL's first communicator loads its plugins and topology
    nccl_communicator warm(0, 1, nccl_communicator::new_unique_id(), 0);
    warm.wait_ready();
  }
  for (int i = 0; i < repeats; ++i) {
    const auto id = nccl_communicator::new_unique_id();
    const auto start = clock_type::now();
    nccl_communicator comm(0, 1, id, 0);
    comm.wait_ready();
    create_ms.push_back(ms_since(start));
  }
  for (int i = 0; i < repeats; ++i) {
    nccl_communicator pending(0, 2, nccl_communicator::new_unique_id(), 0);
    clock_type::time_point aborted_at;
    const auto start = clock_type::now();
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(pending_ms));
      aborted_at = clock_type::now();
      pending.abort();
    });
    bool threw = false;
    try {
      pending.wait_ready();
    } catch (const runtime::comm_error&) {
      threw = true;
    }
    const auto failed_at = clock_type::now();
    aborter.join();
    if (!threw) {
      std::fprintf(stderr, "error: a world of 2 with one rank became ready: NCCL did not wait for the peer\n");
      return 1;
    }
    waited_ms.push_back(std::chrono::duration<double, std::milli>(failed_at - start).count());
    abort_ms.push_back(std::chrono::duration<double, std::milli>(failed_at - aborted_at).count());
    nccl_communicator next(0, 1, nccl_communicator::new_unique_id(), 0);
    auto t = torch::ones({1 << 18}, torch::TensorOptions().device(torch::kCUDA, 0));
    next.all_reduce_sum(t, {0}, 0);
    after_ok = after_ok && torch::equal(t, torch::ones_like(t));
  }

  std::printf("gpu_nccl on cuda:0, NCCL through runtime::nccl_communicator, %d repeats (medians; min-max)\n", repeats);
  auto row = [](const char* what, const std::vector<double>& v) {
    std::printf("%-52s %10.2f ms  (%.2f-%.2f)\n", what, median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  };
  row("1-rank world created and ready", create_ms);
  row("abort() to comm_error, join of a 2-rank world pending", abort_ms);
  row("wait_ready() called to comm_error (incl. pending)", waited_ms);
  std::printf("a new communicator after each abort all-reduced correctly: %s\n", after_ok ? "yes" : "NO");
  std::ofstream(json_path) << nlohmann::json{{"benchmark", "gpu_nccl"},
                                             {"repeats", repeats},
                                             {"pending_ms", pending_ms},
                                             {"create_ms", create_ms},
                                             {"create_median_ms", median(create_ms)},
                                             {"abort_to_error_ms", abort_ms},
                                             {"abort_to_error_median_ms", median(abort_ms)},
                                             {"after_abort_ok", after_ok}}
                                  .dump(2)
                           << "\n";
  return after_ok ? 0 : 1;
}
