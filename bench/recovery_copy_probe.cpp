#include <torch/torch.h>  // first: glog macros

#include "bench/recovery_copy_probe.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <fstream>
#include <memory>
#include <thread>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/recovery_stats.hpp"
#include "runtime/device.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/layer_store.hpp"
#include "runtime/link_profiler.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::bench {

copy_link measure_copy_link(const apps::job_file& job, int first, int end, int repeats) {
  runtime::use_one_compute_thread();
  runtime::layer_store sender(job.model), receiver(job.model);
  sender.ensure(first, end);
  std::vector<runtime::copy_entry> plan;
  for (int l = first; l < end; ++l) plan.push_back({.layer = l, .source = 0, .target = 1});
  std::vector<double> copy_ms, wait_ms;
  double bytes = 0;
  for (int i = 0; i < repeats; ++i) {
    std::vector<std::unique_ptr<runtime::host_transport>> ts;
    for (int r = 0; r < 2; ++r)
      ts.push_back(std::make_unique<runtime::host_transport>(
          runtime::transport_config{.rank = r, .peers = std::vector<runtime::peer_endpoint>(2),
                                    .epoch = static_cast<std::uint64_t>(i + 1)}));
    std::vector<runtime::peer_endpoint> eps(2);
    for (int r = 0; r < 2; ++r) eps[static_cast<std::size_t>(r)].port = ts[static_cast<std::size_t>(r)]->listen_port();
    std::vector<runtime::copy_timing> timing(2);
    std::vector<std::exception_ptr> failed(2);
    {
      std::vector<std::jthread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
          try {
            auto& t = *ts[static_cast<std::size_t>(r)];
            runtime::host_communicator comm(t);
            std::jthread connecting([&] { t.connect(eps); });
            runtime::layer_copies copies(r == 0 ? sender : receiver, r, true, plan);
            timing[static_cast<std::size_t>(r)] = copies.run(t, comm);
          } catch (...) {
            failed[static_cast<std::size_t>(r)] = std::current_exception();
            for (auto& t : ts) t->abort("the copy probe failed");
          }
        });
    }
    for (auto& e : failed)
      if (e) std::rethrow_exception(e);
    bytes = static_cast<double>(timing[1].bytes_received);
    copy_ms.push_back(static_cast<double>(timing[1].copies_us) / 1000);
    wait_ms.push_back(static_cast<double>(timing[1].copy_wait_us) / 1000);
  }
  return {bytes, median(copy_ms), median(wait_ms)};
}

std::map<std::int64_t, double> measure_p2p_gbps(const std::vector<std::int64_t>& sizes, int rounds) {
  std::map<std::int64_t, double> best;
  for (int round = 0; round < rounds; ++round)
    for (const std::int64_t bytes : sizes) {
      const std::int64_t size = std::max<std::int64_t>(bytes, 64);
      const int repeats = static_cast<int>(std::clamp<std::int64_t>((200LL << 20) / size, 15, 200));
      const double gbps = runtime::measure_loopback_link(repeats, 64, size).link.bytes_per_ms / 1e6;
      best[bytes] = std::max(best[bytes], gbps);
    }
  return best;
}

std::optional<std::pair<double, std::int64_t>> p2p_gbps(const std::string& path, double bytes) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("rows")) return std::nullopt;
  std::optional<std::pair<double, std::int64_t>> best;
  double best_d = 1e300;
  for (const auto& r : j["rows"]) {
    if (r.value("op", "") != "p2p" || r.value("impl", "") != "host") continue;
    const double d = std::abs(std::log(r["bytes"].get<double>() / std::max(bytes, 1.0)));
    if (d < best_d) {
      best_d = d;
      best = std::pair{r["gbps"].get<double>(), r["bytes"].get<std::int64_t>()};
    }
  }
  return best;
}

}  // namespace oobleck::bench
