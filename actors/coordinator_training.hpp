#pragma once
// The coordinator's training protocol (epoch formation, transactional steps), split from the
// registry and operator handlers in coordinator.cpp. Private to actors/.

#include <optional>
#include <string>

#include "actors/coordinator.hpp"

namespace oobleck::actors {

/// Plans the job on the live nodes and sends every node its epoch assignment.
void form_epoch(coordinator_pointer self);
void on_node_ready(coordinator_pointer self, messages::node_ready& r);
/// A node of the running epoch is lost: epoch bump, every survivor aborts its data plane, the
/// reconfiguration policy decides the new pipelines and the copy plan, the uncommitted step
/// re-runs in the new epoch (DESIGN §5 "Reconfiguration"). A commit already decided stands.
/// Without a lost node: the epoch is formed again on the same configuration.
void recover(coordinator_pointer self, std::optional<std::int64_t> lost_node);
void on_node_fault(coordinator_pointer self, messages::node_fault& f);
void on_pipeline_done(coordinator_pointer self, messages::pipeline_done& d);
void on_step_committed(coordinator_pointer self, messages::step_committed& c);
/// The step boundary after a commit (and its checkpoint, if one was due): the job finishes, joined
/// nodes enter, or the next step runs.
void after_commit(coordinator_pointer self);
/// Ends the job: tells every live worker, publishes `stopped`, quits (with an error unless the
/// outcome is `finished` or `shutdown`).
void stop_job(coordinator_pointer self, messages::stop_outcome outcome, const std::string& reason);
/// Publishes an event to every subscriber.
void publish(coordinator_pointer self, const messages::job_event& event);

}  // namespace oobleck::actors
