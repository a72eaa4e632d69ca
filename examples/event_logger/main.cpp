// event_logger: an actor of your own that follows a running Oobleck job. It connects to the
// job's coordinator, subscribes with a control proof (the job token never crosses the wire: it
// signs a fresh nonce of the coordinator), and prints each job_event as one line until the job
// stops.
//
//   event_logger HOST:PORT TOKEN_FILE
//
// Exit status: 0 the job stopped; 1 the coordinator cannot be reached or refused; 2 bad
// arguments or token file; 3 the coordinator went away without a stop. It ends with its
// coordinator: it does not follow a replacement (a killed coordinator started again, a standby)
// nor the same one woken from a freeze; oobleck-local's failure injector (actors/injector.cpp)
// shows a subscriber that does.

#include <chrono>
#include <iostream>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"           // read_token_file, control_proof_of
#include "messages/actor_interfaces.hpp"  // coordinator_actor
#include "messages/protocol.hpp"          // add_protocol_types, job_event, subscribe_atom

using namespace oobleck::messages;

namespace {

std::string describe(const job_event& e) {
  const std::string at = " (epoch " + std::to_string(e.epoch) + ")";
  switch (e.kind) {
    case event_kind::node_joined:
      return "node joined: " + std::to_string(e.node) + " " + e.detail;
    case event_kind::node_lost:
      return "node lost: " + std::to_string(e.node) + " " + e.detail + at;
    case event_kind::epoch_formed:
      return "epoch formed: " + std::to_string(e.epoch) + ": " + e.detail;
    case event_kind::step_committed:
      return "step committed: " + std::to_string(e.step) + ", loss " + std::to_string(e.loss) + at;
    case event_kind::stopped:
      return "stopped (" + to_string(e.outcome) + "): " + e.detail + " (epoch " + std::to_string(e.epoch) + ", " +
             std::to_string(e.committed) + " step(s) committed)";
    case event_kind::epoch_forming:
      return "epoch forming: " + std::to_string(e.epoch) + (e.detail.empty() ? "" : " (" + e.detail + ")") +
             ", step " + std::to_string(e.step) + " next";
    case event_kind::commit_stood:
      return "commit stood: step " + std::to_string(e.step) + at;
    case event_kind::step_failed:
      return "step failed: " + std::to_string(e.step) + ": " + e.detail + at;
    case event_kind::checkpoint_written:
      return "checkpoint written: step " + std::to_string(e.step) + " in " + e.detail;
    case event_kind::node_refused:
      return "node refused: " + e.detail;
    case event_kind::waiting_for_nodes:
      return "waiting for nodes: " + e.detail;
    case event_kind::resumed:
      return "resumed at step " + std::to_string(e.step) + " from " + e.detail;
  }
  return "unknown event";
}

/// The subscriber: prints every event; ends normally when the job stops, with an error when the
/// coordinator goes away first.
caf::behavior event_logger(caf::event_based_actor* self, coordinator_actor coordinator) {
  self->monitor(coordinator);
  self->set_down_handler([self](caf::down_msg& dm) {
    std::cout << "the coordinator is gone: " << to_string(dm.reason) << std::endl;
    self->quit(caf::exit_reason::remote_link_unreachable);
  });
  return {
      [self](const job_event& e) {
        std::cout << describe(e) << std::endl;
        if (e.kind == event_kind::stopped) self->quit();
      },
  };
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: event_logger HOST:PORT TOKEN_FILE\n";
    return 2;
  }
  const std::string address = argv[1];
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "error: expected HOST:PORT, got '" << address << "'\n";
    return 2;
  }
  const std::string host = address.substr(0, colon);
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)));
  std::string token;
  try {
    token = oobleck::actors::read_token_file(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }

  caf::actor_system_config cfg;
  add_protocol_types(cfg);  // the same message types as every node of the job
  cfg.load<caf::io::middleman>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  // The coordinator drops a connection that stays silent for its connection timeout (the job's
  // cluster.connection_timeout_ms, 1.5 s by default): a subscriber that only listens must send
  // heartbeats to stay subscribed.
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(250)});
  caf::actor_system sys{cfg};

  auto coordinator = sys.middleman().remote_actor<coordinator_actor>(host, port);
  if (!coordinator) {
    std::cerr << "error: cannot reach the coordinator at " << address << ": " << sys.render(coordinator.error())
              << "\n";
    return 1;
  }
  auto logger = sys.spawn(event_logger, *coordinator);

  // A fresh nonce, then the subscription carrying the proof made with it.
  caf::scoped_actor self{sys};
  std::string refused;
  self->request(*coordinator, std::chrono::seconds(10), nonce_request{protocol_version})
      .receive(
          [&](std::string& nonce) {
            const control_proof proof{nonce, oobleck::actors::control_proof_of(token, nonce)};
            self->request(*coordinator, std::chrono::seconds(10), subscribe_atom_v, logger, proof)
                .receive([](std::string&) {}, [&](caf::error& e) { refused = describe(e); });
          },
          [&](caf::error& e) { refused = describe(e); });
  if (!refused.empty()) {
    std::cerr << "error: the coordinator refused the subscription: " << refused << "\n";
    caf::anon_send_exit(logger, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::cout << "subscribed to " << address << std::endl;

  int status = 0;
  self->monitor(logger);
  self->receive([&](caf::down_msg& dm) { status = dm.reason ? 3 : 0; });
  return status;
}
