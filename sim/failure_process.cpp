#include "sim/failure_process.hpp"

#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "messages/input_error.hpp"

namespace oobleck::sim {

double default_mttf_h(double gpus) {
  // Meta (HPCA 2025): 7.9 h at 1,024 GPUs, 1.8 h at 16,384 GPUs; a straight line in log-log.
  const double slope = std::log(1.8 / 7.9) / std::log(16384.0 / 1024.0);
  return 7.9 * std::pow(gpus / 1024.0, slope);
}

cluster_trace generate_failures(const failure_process& p) {
  using messages::input_error;
  if (p.nodes < 1) throw input_error("failure process: nodes must be >= 1");
  if (p.spare_nodes < 0) throw input_error("failure process: spare nodes must be >= 0");
  if (!(p.mttf_h > 0) || !std::isfinite(p.mttf_h)) throw input_error("failure process: MTTF must be > 0 hours");
  if (!(p.repair_h >= 0) || !std::isfinite(p.repair_h)) throw input_error("failure process: repair time must be >= 0");
  if (!(p.duration_h > 0) || !std::isfinite(p.duration_h))
    throw input_error("failure process: duration must be > 0 hours");
  const double hour = 3600e3;
  const double per_node_rate = 1.0 / (p.mttf_h * hour * p.nodes);  // per ms
  const double end = p.duration_h * hour;
  std::mt19937_64 rng(p.seed);
  auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };  // [0, 1)
  auto exponential = [&](double rate) { return -std::log1p(-uniform()) / rate; };

  cluster_trace t;
  std::vector<int> alive;  // ids
  auto new_node = [&] {
    const int id = static_cast<int>(t.names.size());
    t.names.push_back("node" + std::to_string(id));
    alive.push_back(id);
    return id;
  };
  cluster_change first{.ms = 0};
  for (int i = 0; i < p.nodes + p.spare_nodes; ++i) first.ready.push_back(new_node());
  t.changes.push_back(first);
  t.most_alive = static_cast<int>(alive.size());
  std::map<double, int> repairs;  // time -> how many nodes come back then
  double now = 0;
  while (true) {
    const double next_failure =
        alive.empty() ? INFINITY : now + exponential(per_node_rate * static_cast<double>(alive.size()));
    const double next_repair = repairs.empty() ? INFINITY : repairs.begin()->first;
    now = std::min(next_failure, next_repair);
    if (!(now < end)) break;
    cluster_change c{.ms = now};
    if (next_repair <= next_failure) {
      // A repair first: the failure clock is memoryless, so redrawing it afterwards is exact.
      for (int i = 0; i < repairs.begin()->second; ++i) c.ready.push_back(new_node());
      repairs.erase(repairs.begin());
    } else {
      const auto k = static_cast<std::size_t>(uniform() * static_cast<double>(alive.size()));
      c.removed.push_back(alive[k]);
      alive[k] = alive.back();
      alive.pop_back();
      if (p.repair_h > 0) ++repairs[now + p.repair_h * hour];
    }
    t.most_alive = std::max(t.most_alive, static_cast<int>(alive.size()));
    t.changes.push_back(std::move(c));
  }
  t.start_ms = 0;
  t.end_ms = end;
  return t;
}

std::string describe(const failure_process& p) {
  std::ostringstream s;
  s.precision(3);
  s << "exponential per node, MTTF " << p.mttf_h << " h over " << p.nodes << " nodes";
  if (p.spare_nodes > 0) s << ", " << p.spare_nodes << " spares";
  if (p.repair_h > 0) s << ", repair " << p.repair_h << " h";
  else s << ", no repair";
  s << ", seed " << p.seed;
  return s.str();
}

}  // namespace oobleck::sim
