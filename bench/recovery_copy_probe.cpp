#include <torch/torch.h>  // first: glog macros

#include "bench/recovery_copy_probe.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/recovery_stats.hpp"
#include "runtime/device.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::bench {

copy_path measure_copy_path(const apps::job_file& job, int layer) {
  runtime::use_one_compute_thread();
  runtime::layer_store sender(job.model), receiver(job.model);
  sender.ensure(layer);
  std::vector<double> ser, ins, cpy;
  std::vector<std::byte> bytes;
  for (int i = 0; i < 7; ++i) {
    auto t = clock_type::now();
    bytes = sender.serialize_layer(layer);
    ser.push_back(ms_between(t, clock_type::now()));
    t = clock_type::now();
    receiver.install_layer(layer, bytes);
    ins.push_back(ms_between(t, clock_type::now()));
    std::vector<std::byte> copy(bytes.size());
    t = clock_type::now();
    std::memcpy(copy.data(), bytes.data(), bytes.size());
    cpy.push_back(ms_between(t, clock_type::now()));
  }
  return {static_cast<double>(bytes.size()), median(ser), median(ins), median(cpy)};
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
