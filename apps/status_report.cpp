#include "apps/status_report.hpp"

#include <charconv>
#include <cmath>
#include <map>
#include <memory>

#include <caf/event_based_actor.hpp>

#include "actors/admission.hpp"

namespace oobleck::apps {

using namespace oobleck::messages;

namespace {

/// A sample value as Prometheus reads it: shortest round-trip decimal, NaN, +Inf, -Inf.
std::string sample(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc{} ? std::string(buf, end) : "NaN";
}

std::string label_value(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void gauge(std::string& out, const char* name, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         sample(value) + "\n";
}

}  // namespace

nlohmann::json status_json(const job_status& s) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : s.nodes)
    nodes.push_back({{"node", n.node}, {"name", n.name}, {"state", n.state}, {"rank", n.rank}});
  nlohmann::json pipelines = nlohmann::json::array();
  for (const auto& p : s.pipelines)
    pipelines.push_back(
        {{"nodes", p.nodes}, {"stage_layers", p.stage_layers}, {"microbatches", p.microbatches}});
  nlohmann::json out = {{"state", s.state},
          {"epoch", s.epoch},
          {"committed_steps", s.committed_steps},
          {"last_loss", static_cast<double>(s.last_loss)},
          {"samples_per_second", static_cast<double>(s.samples_per_second)},
          {"dropped_messages", s.dropped_messages},
          {"refused_messages", s.refused_messages},
          {"nodes", nodes},
          {"pipelines", pipelines}};
  // Below the minimum: how many nodes the job waits for ((f + 1) x n0).
  if (s.state == "waiting") out["nodes_needed"] = s.nodes_needed;
  return out;
}

std::string prometheus_metrics(const job_status& s) {
  std::string out;
  gauge(out, "oobleck_epoch", "The job's current epoch (configuration); 0 before the first.",
        static_cast<double>(s.epoch));
  gauge(out, "oobleck_committed_steps", "Training steps committed so far.",
        static_cast<double>(s.committed_steps));
  gauge(out, "oobleck_last_loss", "Mean loss over the global batch of the last committed step.", static_cast<double>(s.last_loss));
  gauge(out, "oobleck_samples_per_second", "Samples per second of the last committed step.",
        static_cast<double>(s.samples_per_second));
  gauge(out, "oobleck_dropped_messages",
        "Messages dropped for a stale epoch or step, from a lost node, or refused.",
        static_cast<double>(s.dropped_messages));
  gauge(out, "oobleck_nodes_needed",
        "While the job waits for nodes (below its minimum): the nodes it needs to go on; 0 otherwise.",
        static_cast<double>(s.nodes_needed));
  gauge(out, "oobleck_refused_messages",
        "Of the dropped messages, those refused: not sent by the actor admitted for the node they name, or malformed.",
        static_cast<double>(s.refused_messages));
  // Every usual state is always exported (0 when empty), so a series does not vanish.
  std::map<std::string, int> by_state{{"registered", 0}, {"training", 0}, {"idle", 0}, {"lost", 0}};
  for (const auto& n : s.nodes) ++by_state[n.state];
  out += "# HELP oobleck_nodes Nodes of the job by state.\n# TYPE oobleck_nodes gauge\n";
  for (const auto& [state, count] : by_state)
    out += "oobleck_nodes{state=\"" + label_value(state) + "\"} " + std::to_string(count) + "\n";
  out += "# HELP oobleck_job_state 1 for the job's current state.\n# TYPE oobleck_job_state gauge\n";
  out += "oobleck_job_state{state=\"" + label_value(s.state) + "\"} 1\n";
  return out;
}

void request_status(caf::actor_system& sys, const coordinator_actor& coordinator, std::string token,
                    std::chrono::milliseconds timeout, std::function<void(status_reply)> done) {
  // Shared so that the nested handlers can each hold it; called once by whichever answer ends it.
  auto finish = std::make_shared<std::function<void(status_reply)>>(std::move(done));
  sys.spawn([coordinator, token = std::move(token), timeout, finish](caf::event_based_actor* self) {
    auto fail = [finish](const caf::error& e) { (*finish)({std::nullopt, describe(e)}); };
    self->request(coordinator, timeout, nonce_request{protocol_version})
        .then(
            [=](std::string& nonce) {
              const control_proof proof{nonce, actors::control_proof_of(token, nonce)};
              self->request(coordinator, timeout, status_atom_v, proof)
                  .then([finish](job_status& s) { (*finish)({std::move(s), {}}); }, fail);
            },
            fail);
  });
}

}  // namespace oobleck::apps
