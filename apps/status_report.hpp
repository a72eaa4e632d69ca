#pragma once
// A job's status as operators' tools show it: JSON (`oobleck-ctl status --json`, `GET /status`)
// and Prometheus text (`GET /metrics`); and asking the coordinator for it without blocking the
// caller (the HTTP server's thread must keep serving other clients meanwhile).

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <caf/actor_system.hpp>
#include <nlohmann/json.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::apps {

/// {"state", "epoch", "committed_steps", "last_loss", "samples_per_second", "dropped_messages",
///  "nodes": [{"node", "name", "state", "rank"}], "pipelines": [{"nodes", "stage_layers", "microbatches"}]}
nlohmann::json status_json(const messages::job_status& s);

/// Prometheus text exposition (format 0.0.4): the job's gauges with # HELP and # TYPE lines.
std::string prometheus_metrics(const messages::job_status& s);

/// A status, or why there is none.
struct status_reply {
  std::optional<messages::job_status> status;
  std::string error;
};

/// Asks `coordinator` for its status as an operator (a fresh nonce, then the request with its
/// control proof) from a short-lived actor of `sys`; returns at once. `done` is called exactly once,
/// on one of CAF's threads, within about 2 x `timeout`.
void request_status(caf::actor_system& sys, const messages::coordinator_actor& coordinator,
                    std::string token, std::chrono::milliseconds timeout,
                    std::function<void(status_reply)> done);

}  // namespace oobleck::apps
