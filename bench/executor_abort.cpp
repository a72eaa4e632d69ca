// How fast an aborted epoch releases a stuck stage: a 2-stage pipeline over the host transport
// (ranks on threads of this process) where stage 1 takes its activation and then freezes; stage 0
// waits for a gradient that never comes. Measured from the abort to stage 0's run_step throwing
// comm_error, (a) when stage 0's own data plane is aborted (the node's monitor tearing the epoch
// down) and (b) when the frozen peer's is (its sockets close, as when a process dies). The
// executor tests only check that the stage is released before a deadline of seconds; the figure
// is read here.
//
// usage: executor_abort [--quick] [--json PATH]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/stage_executor.hpp"

using namespace oobleck;
using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

namespace {

double percentile(std::vector<double> xs, double p) {
  std::sort(xs.begin(), xs.end());
  return xs[static_cast<std::size_t>(p * static_cast<double>(xs.size() - 1) + 0.5)];
}

/// One trial: milliseconds from the abort to stage 0 giving up.
double trial(bool abort_peer) {
  const runtime::gpt_config model{.vocab = 64, .d_model = 32, .heads = 2, .blocks = 2, .seq_len = 16, .seed = 3};
  std::vector<std::unique_ptr<runtime::host_transport>> transports;
  for (int r = 0; r < 2; ++r)
    transports.push_back(std::make_unique<runtime::host_transport>(
        runtime::transport_config{.rank = r, .peers = std::vector<runtime::peer_endpoint>(2), .epoch = 1}));
  std::vector<runtime::peer_endpoint> peers(2);
  for (int r = 0; r < 2; ++r) peers[r].port = transports[r]->listen_port();
  std::thread connect_peer([&] { transports[1]->connect(peers); });
  transports[0]->connect(peers);
  connect_peer.join();
  runtime::host_communicator comm0(*transports[0]), comm1(*transports[1]);
  runtime::layer_store store(model);
  store.ensure(0, 2);
  runtime::stage_executor stage0(store, {0, 2, 0, 2, -1, 1}, comm0, {.microbatch_size = 2, .global_microbatches = 1});
  const auto inputs = torch::randint(0, model.vocab, {2, model.seq_len}, torch::kInt64);
  clock_type::time_point gave_up;
  auto stuck = std::async(std::launch::async, [&] {
    try {
      stage0.run_step(0, 0, 1, inputs, inputs);
    } catch (const runtime::comm_error&) {
      gave_up = clock_type::now();
    }
  });
  // Stage 1 takes the activation (tag 0: forward of microbatch 0), then freezes. Stage 0 has
  // sent it and moves straight on to wait for the gradient; give it a moment to get there.
  auto activation = torch::empty({2, model.seq_len, model.d_model});
  comm1.recv(activation, 0, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto aborted = clock_type::now();
  (abort_peer ? comm1 : comm0).abort();
  stuck.wait();
  return std::chrono::duration<double, std::milli>(gave_up - aborted).count();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path = "executor_abort.json";
  oobleck::bench::flag_set app{
      "executor_abort: time from aborting an epoch to a stuck stage executor throwing comm_error, over\n"
      "the host transport (2 ranks on threads): own data plane aborted, and peer's aborted.",
      "executor_abort"};
  app.add_switch("--quick", quick, "3 trials instead of 50 (a smoke run)");
  app.add_text("--json", json_path, "write the results to PATH (default executor_abort.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  runtime::use_one_compute_thread();
  const int trials = quick ? 3 : 50;
  std::printf("2-stage pipeline over the host transport, stage 1 frozen after its activation; %d trials each\n", trials);
  std::printf("%-36s %10s %10s %10s\n", "abort to stage 0 throwing", "median ms", "p90 ms", "max ms");
  json out{{"benchmark", "executor_abort"}, {"trials", trials}};
  for (bool abort_peer : {false, true}) {
    std::vector<double> ms;
    for (int t = 0; t < trials; ++t) ms.push_back(trial(abort_peer));
    const char* what = abort_peer ? "peer's data plane aborted" : "own data plane aborted";
    std::printf("%-36s %10.3f %10.3f %10.3f\n", what, percentile(ms, 0.5), percentile(ms, 0.9),
                *std::max_element(ms.begin(), ms.end()));
    out[abort_peer ? "peer_abort" : "own_abort"] = json{{"median_ms", percentile(ms, 0.5)},
                                                        {"p90_ms", percentile(ms, 0.9)},
                                                        {"max_ms", *std::max_element(ms.begin(), ms.end())}};
  }
  std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
