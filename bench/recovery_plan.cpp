#include "bench/recovery_plan.hpp"

#include <algorithm>
#include <map>


namespace oobleck::bench {

job_model::job_model(const std::string& text, int nodes) : job(apps::parse_job(text, "job")) {
  profile = apps::modelled_profile(job);
  config = apps::planner_job(job, nodes, job.cluster.fault_tolerance);
}

plan_replay::plan_replay(const job_model& m) : m_(m), plan_(planning::plan_job(m.profile, m.config)) {
  costs_.emplace(m.profile, planning::job_memory(m.profile, m.config));
  formed_ = {plan_.pipelines, plan_.idle_nodes};
}

planning::reconfiguration plan_replay::lose(const std::vector<planning::node_id>& lost) {
  const planning::reconfiguration_context ctx{plan_.templates, *costs_, m_.config.fault_tolerance,
                                              m_.config.global_batch / m_.config.microbatch, m_.config.microbatch};
  auto r = planning::reconfigure(ctx, formed_, lost, {});
  if (r.action == planning::reconfiguration_action::continue_training) formed_ = {r.pipelines, r.idle_nodes};
  return r;
}

std::int64_t busiest_link_bytes(const std::vector<planning::layer_copy>& copies) {
  std::map<planning::node_id, std::int64_t> sent, received;
  for (const auto& c : copies) {
    sent[c.from_node] += c.bytes;
    received[c.to_node] += c.bytes;
  }
  std::int64_t most = 0;
  for (const auto& [n, b] : sent) most = std::max(most, b);
  for (const auto& [n, b] : received) most = std::max(most, b);
  return most;
}

std::string default_heartbeat() {
  const apps::cluster_section d;
  return std::to_string(d.heartbeat_interval_ms) + "/" + std::to_string(d.connection_timeout_ms);
}

}  // namespace oobleck::bench
