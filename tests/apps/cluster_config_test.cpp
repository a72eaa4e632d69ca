// The CAF configuration every cluster program runs with.

#include "apps/cluster_common.hpp"

#include <doctest/doctest.h>

#include <caf/config_value.hpp>

using namespace oobleck::apps;

TEST_CASE("cluster programs run CAF's scheduler with workers that sleep when idle, and heartbeats as set") {
  cluster_config cfg;
  // CAF's default (work stealing) polls for ~25 ms after every message: with a few control
  // messages per step that took the compute of 2 workers on 2 cores down to 0.7x.
  CHECK(caf::get_or(cfg, "scheduler.policy", caf::atom("stealing")) == caf::atom("sharing"));
  CHECK(caf::get_or(cfg, "scheduler.max-threads", std::size_t{0}) == 2);
  cfg.set_heartbeat(250, 1500);
  CHECK(caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0}) == std::chrono::milliseconds(250));
  CHECK(caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0}) == std::chrono::milliseconds(1500));
  // The system starts with it (an unknown policy would fall back silently in CAF 0.17).
  caf::actor_system sys{cfg};
  CHECK(sys.scheduler().num_workers() == 2);
}
