#include "apps/coordinator_metrics.hpp"

#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace oobleck::apps {

std::string step_json(const actors::step_record& r) {
  nlohmann::json pipelines = nlohmann::json::array();
  for (const auto& p : r.pipelines)
    pipelines.push_back(
        {{"nodes", planning::numbers(p.nodes)}, {"stage_layers", p.stage_layers}, {"microbatches", p.microbatches}});
  nlohmann::json digests = nlohmann::json::object();
  for (const auto& [layer, list] : r.layer_digests) {
    nlohmann::json hex = nlohmann::json::array();
    for (auto d : list) {
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(d));
      hex.push_back(buf);
    }
    digests[std::to_string(layer.value)] = hex;
  }
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  j["loss"] = r.loss;
  j["samples"] = r.samples;
  j["pipelines"] = pipelines;
  j["layer_digests"] = digests;
  if (!r.tied_digests.empty()) {
    // The tied embedding's matrix in every holder of layer 0 and of the last layer: all equal.
    nlohmann::json tied = nlohmann::json::array();
    for (auto d : r.tied_digests) {
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(d));
      tied.push_back(buf);
    }
    j["tied_digests"] = tied;
  }
  if (r.grad_norm > 0) {
    j["grad_norm"] = r.grad_norm;
    j["grad_scale"] = r.grad_scale;
  }
  j["wall_ms"] = r.wall_ms;
  if (r.ideal_ms > 0) j["ideal_ms"] = r.ideal_ms;
  if (r.predicted_ms > 0) j["predicted_ms"] = r.predicted_ms;
  const auto& b = r.breakdown;
  nlohmann::ordered_json breakdown;
  breakdown["compute_ms"] = b.compute_ms;
  breakdown["p2p_wait_ms"] = b.p2p_wait_ms;
  breakdown["allreduce_ms"] = b.allreduce_ms;
  breakdown["optimizer_ms"] = b.optimizer_ms;
  breakdown["control_ms"] = b.control_ms;
  breakdown["other_ms"] = b.other_ms;
  breakdown["ahead_ms"] = b.ahead_ms;
  j["breakdown"] = breakdown;
  // When the line is written (at the commit): throughput over time, and over a window, from the
  // file alone (oobleck-local --trace, bench/sim_validation).
  j["unix_ms"] = std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  return j.dump();
}

std::string checkpoint_stop_json(const actors::checkpoint_stop_record& r) {
  nlohmann::ordered_json j;
  j["event"] = "checkpoint_and_stop";
  j["reason"] = r.reason;
  j["dir"] = r.dir ? nlohmann::ordered_json(*r.dir) : nlohmann::ordered_json(nullptr);
  j["latest"] = r.latest ? nlohmann::ordered_json(*r.latest) : nlohmann::ordered_json(nullptr);
  j["step"] = r.step;
  return j.dump();
}

std::string eval_json(const actors::eval_record& r) {
  nlohmann::ordered_json j;
  j["event"] = "eval";
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["windows"] = r.windows;
  j["epoch"] = r.epoch;
  j["wall_ms"] = r.wall_ms;
  return j.dump();
}

void write_metrics_records(actors::coordinator_deps& deps, std::shared_ptr<std::ostream> metrics) {
  deps.on_step = [metrics](const actors::step_record& r) { *metrics << step_json(r) << std::endl; };
  deps.on_reconfigured = [metrics](const actors::reconfiguration_record& r) {
    nlohmann::ordered_json j;
    j["event"] = "reconfigured";
    j["epoch"] = r.epoch;
    j["lost"] = planning::numbers(r.lost);
    j["joined"] = planning::numbers(r.joined);
    j["action"] = r.action;
    j["detect_ms"] = r.detect_ms;
    j["plan_ms"] = r.plan_ms;
    j["copy_bytes"] = r.copy_bytes;
    j["copy_ms"] = r.copy_ms;
    j["copy_wait_ms"] = r.copy_wait_ms;
    j["connect_ms"] = r.connect_ms;
    j["prepare_ms"] = r.prepare_ms;
    j["views_ms"] = r.views_ms;
    j["form_ms"] = r.form_ms;
    j["resumed_step"] = r.resumed_step;
    j["downtime_ms"] = r.downtime_ms;
    *metrics << j.dump() << std::endl;
  };
  deps.on_restored = [metrics](const actors::restore_record& r) {
    nlohmann::ordered_json j;
    j["event"] = "coordinator_restored";
    j["term"] = r.term;
    j["nodes"] = r.nodes;
    j["step"] = r.step;
    j["completed"] = r.completed;
    j["downtime_ms"] = r.downtime_ms;
    *metrics << j.dump() << std::endl;
  };
  deps.on_waiting = [metrics](const actors::waiting_record& r) {
    nlohmann::ordered_json j;
    j["event"] = "waiting_for_nodes";
    j["have"] = r.have;
    j["need"] = r.need;
    j["step"] = r.step;
    j["reason"] = r.reason;
    j["checkpoint"] = r.checkpoint ? nlohmann::ordered_json(*r.checkpoint) : nlohmann::ordered_json(nullptr);
    *metrics << j.dump() << std::endl;
  };
  deps.on_resumed = [metrics](const actors::resumed_record& r) {
    nlohmann::ordered_json j;
    j["event"] = "resumed";
    j["source"] = r.source;
    j["step"] = r.step;
    j["nodes"] = r.nodes;
    j["waited_ms"] = r.waited_ms;
    if (!r.checkpoint.empty()) j["checkpoint"] = r.checkpoint;
    *metrics << j.dump() << std::endl;
  };
}

}  // namespace oobleck::apps
