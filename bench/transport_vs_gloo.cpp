// The host transport against c10d's ProcessGroupGloo (its peer) on loopback, side by side in one
// run: p2p bandwidth for 1-64 MiB between 2 processes, and all-reduce latency and bandwidth for
// 4 KiB-64 MiB over 2, 3 and 4 processes. Every process runs all of them, in the same order. The
// host transport's all-reduce is measured twice: as it runs here (the processes share this machine,
// so through shared memory) and with transport_config::shared_memory off (the TCP ring, as between
// machines).
//
// usage: transport_vs_gloo [--quick] [--json PATH]

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "runtime/child_process.hpp"
#include "runtime/transport/host_transport.hpp"

using namespace oobleck;
using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

namespace {

struct child_args {
  int rank, world;
  std::string store, out;
  bool quick;
};

int iterations(std::size_t bytes, bool quick) {
  const std::size_t budget = (quick ? 16u : 256u) << 20;
  return static_cast<int>(std::clamp<std::size_t>(budget / bytes, 3, quick ? 20 : 200));
}

int run_child(const child_args& a) {
  torch::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::FileStore>(a.store, a.world);
  // The host transports' ports go through the same store as gloo's rendezvous.
  auto connect = [&](runtime::host_transport& t, const std::string& prefix) {
    store->set(prefix + std::to_string(a.rank), std::vector<uint8_t>{static_cast<uint8_t>(t.listen_port() >> 8),
                                                                      static_cast<uint8_t>(t.listen_port() & 0xff)});
    std::vector<runtime::peer_endpoint> peers(a.world);
    for (int r = 0; r < a.world; ++r) {
      const auto v = store->get(prefix + std::to_string(r));
      peers[r].port = static_cast<std::uint16_t>((v[0] << 8) | v[1]);
    }
    t.connect(peers);
  };
  runtime::host_transport host({.rank = a.rank, .peers = std::vector<runtime::peer_endpoint>(a.world), .epoch = 1});
  connect(host, "port/");
  runtime::host_transport ring(
      {.rank = a.rank, .peers = std::vector<runtime::peer_endpoint>(a.world), .epoch = 2, .shared_memory = false});
  connect(ring, "ringport/");
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  c10d::ProcessGroupGloo gloo(c10::make_intrusive<c10d::PrefixStore>("gloo", store), a.rank, a.world, options);
  std::vector<int> group(a.world);
  for (int r = 0; r < a.world; ++r) group[r] = r;
  auto barrier = [&] {
    float x = 1;
    host.all_reduce_sum(group, {&x, 1});
  };
  std::ofstream out;
  if (a.rank == 0) out.open(a.out);
  auto record = [&](const char* op, const char* impl, std::size_t bytes, double ms, double gbps) {
    if (a.rank == 0)
      out << json{{"world", a.world}, {"op", op}, {"impl", impl}, {"bytes", static_cast<std::int64_t>(bytes)},
                  {"ms", ms}, {"gbps", gbps}}
                 .dump()
          << "\n";
  };
  // Point to point: ping-pong between ranks 0 and 1 (only with 2 processes).
  if (a.world == 2) {
    for (std::size_t mib : {1u, 4u, 16u, 64u}) {
      const std::size_t bytes = mib << 20;
      const int iters = iterations(bytes, a.quick);
      auto t = torch::ones({static_cast<std::int64_t>(bytes / 4)});
      std::span<std::byte> span{static_cast<std::byte*>(t.data_ptr()), bytes};
      auto host_round = [&] {
        if (a.rank == 0) {
          host.send(1, 1, span);
          host.recv(1, 1, span);
        } else {
          host.recv(0, 1, span);
          host.send(0, 1, span);
        }
      };
      host_round();  // warm-up: buffers allocated and faulted in, not timed (same for gloo)
      barrier();
      auto start = clock_type::now();
      for (int i = 0; i < iters; ++i) host_round();
      double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count() / iters;
      record("p2p", "host", bytes, ms / 2, 2.0 * bytes / (ms * 1e6));
      std::vector<at::Tensor> ts{t};
      auto gloo_round = [&] {
        if (a.rank == 0) {
          gloo.send(ts, 1, 1)->wait();
          gloo.recv(ts, 1, 2)->wait();
        } else {
          gloo.recv(ts, 0, 1)->wait();
          gloo.send(ts, 0, 2)->wait();
        }
      };
      gloo_round();
      barrier();
      start = clock_type::now();
      for (int i = 0; i < iters; ++i) gloo_round();
      ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count() / iters;
      record("p2p", "gloo", bytes, ms / 2, 2.0 * bytes / (ms * 1e6));
    }
  }
  // All-reduce over every process. Bus bandwidth 2 (n - 1) / n * bytes / time, as NCCL reports it.
  for (std::size_t bytes : {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20,
                            std::size_t{64} << 20}) {
    const int iters = iterations(bytes, a.quick);
    auto t = torch::ones({static_cast<std::int64_t>(bytes / 4)});
    const double factor = 2.0 * (a.world - 1) / a.world;
    for (auto* transport : {&host, &ring}) {
      auto host_reduce = [&] {
        transport->all_reduce_sum(group, {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())});
      };
      host_reduce();  // warm-up, as for gloo below
      barrier();
      const auto start = clock_type::now();
      for (int i = 0; i < iters; ++i) host_reduce();
      const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count() / iters;
      record("allreduce", transport == &host ? "host" : "host_ring", bytes, ms, factor * bytes / (ms * 1e6));
    }
    std::vector<at::Tensor> ts{t};
    gloo.allreduce(ts)->wait();
    barrier();
    const auto start = clock_type::now();
    for (int i = 0; i < iters; ++i) gloo.allreduce(ts)->wait();
    const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count() / iters;
    record("allreduce", "gloo", bytes, ms, factor * bytes / (ms * 1e6));
  }
  barrier();
  return 0;
}

std::string human(std::size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path = "transport_vs_gloo.json";
  std::vector<std::string> child;  // RANK WORLD STORE OUT QUICK(1|0): this program as one of its ranks
  oobleck::bench::flag_set app{
      "transport_vs_gloo: host transport vs c10d ProcessGroupGloo on loopback: p2p bandwidth (2 processes)\n"
      "and all-reduce latency and bus bandwidth (2, 3, 4 processes).",
      "transport_vs_gloo"};
  app.add_switch("--quick", quick, "fewer iterations (a smoke run)");
  app.add_text("--json", json_path, "write the results to PATH (default transport_vs_gloo.json)");
  app.add_internal_words("--child", child, 5,
                         "run as rank RANK of WORLD processes (the benchmark starts its ranks so)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  if (!child.empty()) {
    try {
      return run_child({std::stoi(child[0]), std::stoi(child[1]), child[2], child[3], child[4] == "1"});
    } catch (const std::exception& e) {
      std::cerr << "child " << child[0] << ": " << e.what() << "\n";
      return 1;
    }
  }
  json rows = json::array();
  std::string self;
  try {
    self = oobleck::runtime::this_program_path();
  } catch (const std::runtime_error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  for (int world : {2, 3, 4}) {
    std::cerr << "running " << world << " processes..." << std::endl;
    const std::string base = "/tmp/oobleck-tvg-" + std::to_string(::getpid()) + "-" + std::to_string(world);
    const std::string store = base + ".store", out = base + ".jsonl";
    std::remove(store.c_str());
    std::vector<oobleck::runtime::child_process> children;
    for (int r = 0; r < world; ++r) {
      try {
        children.emplace_back(self, std::vector<std::string>{"--child", std::to_string(r), std::to_string(world), store,
                                                             out, quick ? "1" : "0"});
      } catch (const oobleck::runtime::child_spawn_error&) {
        std::cerr << "cannot start a child process\n";
        return 1;
      }
    }
    bool ok = true;
    for (auto& child : children) ok = child.wait() == 0 && ok;
    if (!ok) {
      std::cerr << "a child process failed\n";
      return 1;
    }
    std::ifstream in(out);
    std::string line;
    while (std::getline(in, line)) rows.push_back(json::parse(line));
    std::remove(out.c_str());
    std::remove(store.c_str());
  }
  // Side by side: host | gloo | host/gloo speed.
  auto find = [&](int world, const std::string& op, const std::string& impl, std::int64_t bytes) -> const json* {
    for (const auto& r : rows)
      if (r.at("world") == world && r.at("op") == op && r.at("impl") == impl && r.at("bytes") == bytes)
        return &r;
    return nullptr;
  };
  std::printf("p2p, 2 processes (one-way time, bandwidth)\n%10s | %10s %10s | %10s %10s | %8s\n", "size", "host ms",
              "host GB/s", "gloo ms", "gloo GB/s", "host/gloo");
  for (std::size_t mib : {1u, 4u, 16u, 64u}) {
    const auto* h = find(2, "p2p", "host", mib << 20);
    const auto* g = find(2, "p2p", "gloo", mib << 20);
    std::printf("%10s | %10.3f %10.2f | %10.3f %10.2f | %7.2fx\n", human(mib << 20).c_str(), h->at("ms").get<double>(),
                h->at("gbps").get<double>(), g->at("ms").get<double>(), g->at("gbps").get<double>(),
                g->at("ms").get<double>() / h->at("ms").get<double>());
  }
  for (int world : {2, 3, 4}) {
    std::printf(
        "\nall-reduce, %d processes (latency, bus bandwidth; host: shared memory, ring: TCP)\n%10s | %10s %10s | %10s "
        "%10s | %10s %10s | %8s %8s\n",
        world, "size", "host ms", "host GB/s", "ring ms", "ring GB/s", "gloo ms", "gloo GB/s", "ring/host", "gloo/host");
    for (std::size_t bytes : {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20,
                              std::size_t{64} << 20}) {
      const auto* h = find(world, "allreduce", "host", static_cast<std::int64_t>(bytes));
      const auto* r = find(world, "allreduce", "host_ring", static_cast<std::int64_t>(bytes));
      const auto* g = find(world, "allreduce", "gloo", static_cast<std::int64_t>(bytes));
      const double host_ms = h->at("ms").get<double>();
      std::printf("%10s | %10.3f %10.2f | %10.3f %10.2f | %10.3f %10.2f | %7.2fx %7.2fx\n", human(bytes).c_str(),
                  host_ms, h->at("gbps").get<double>(), r->at("ms").get<double>(), r->at("gbps").get<double>(),
                  g->at("ms").get<double>(), g->at("gbps").get<double>(), r->at("ms").get<double>() / host_ms,
                  g->at("ms").get<double>() / host_ms);
    }
  }
  std::ofstream(json_path) << json{{"benchmark", "transport_vs_gloo"}, {"rows", std::move(rows)}}.dump(2) << "\n";
  std::printf("\nresults written to %s\n", json_path.c_str());
  return 0;
}
