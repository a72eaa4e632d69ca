// A stage of a test pipeline in its own process, over the host transport. Protocol on
// stdin/stdout, one line each: it prints "port P", reads "peers P0 P1 ...", trains, saves its
// layers' parameters to RESULT, prints "done". Used by multiprocess_test.cpp.
//
// usage: stage_worker RANK RESULT
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "support/cluster_harness.hpp"
#include "support/multiprocess_scenario.hpp"

using namespace oobleck;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: stage_worker RANK RESULT\n";
    return 2;
  }
  runtime::use_one_compute_thread();
  const int rank = std::stoi(argv[1]);
  const std::string result = argv[2];
  const auto scenario = testing::multiprocess_scenario();
  const auto setup = testing::small_setup();
  const int world = static_cast<int>(scenario.ranks.size());
  try {
    runtime::transport_config config{.rank = rank, .peers = std::vector<runtime::peer_endpoint>(world), .epoch = 1};
    runtime::host_transport transport(config);
    std::cout << "port " << transport.listen_port() << std::endl;
    std::string word;
    std::cin >> word;
    std::vector<runtime::peer_endpoint> peers(world);
    for (auto& p : peers) std::cin >> p.port;
    transport.connect(peers);
    runtime::host_communicator comm(transport);
    const auto& me = scenario.ranks[rank];
    runtime::layer_store store(setup.model);
    store.ensure(me.position.first_layer, me.position.end_layer);
    runtime::stage_executor executor(store, me.position, comm,
                                     {.microbatch_size = setup.microbatch,
                                      .global_microbatches = setup.global_batch / setup.microbatch,
                                      .optimizer = setup.optimizer});
    const auto& data = testing::test_dataset(setup.model.seq_len);
    runtime::sampler sampler(setup.data_seed, data.size(), setup.global_batch);
    for (int step = 0; step < setup.steps; ++step) {
      const auto ids = runtime::sampler::slice(sampler.step_samples(step), scenario.microbatches, me.pipeline,
                                               setup.microbatch);
      const auto [inputs, targets] = data.batch(ids);
      int first_microbatch = 0;
      for (int p = 0; p < me.pipeline; ++p) first_microbatch += scenario.microbatches[p];
      executor.run_step(step, first_microbatch, scenario.microbatches[me.pipeline], inputs, targets);
      executor.reduce_gradients(scenario.layer_groups);
      executor.commit();
    }
    std::vector<torch::Tensor> params;
    for (int l = me.position.first_layer; l < me.position.end_layer; ++l)
      for (auto& p : executor.parameters(l)) params.push_back(p.detach().clone());
    torch::save(params, result);
    std::cout << "done" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "stage_worker " << rank << ": " << e.what() << "\n";
    return 1;
  }
}
