// The failure injector following its coordinator to one found again (actors/injector.hpp), with
// fake coordinators in one process on CAF's real scheduler (the injector is detached: finding a
// coordinator blocks). A coordinator found again that never answers the subscription is the case
// of a connection whose route CAF 0.17 lost on the coordinator's side (apps/coordinator_link.hpp):
// the injector closes its connection before it looks again, as a worker's monitor does, instead of
// asking over the same dead route until its grace ends (seen once in `coordinator clients e2e`:
// the run ended with the injector still asking).

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/injector.hpp"

using namespace oobleck;
using namespace oobleck::messages;

namespace {

struct fake_coordinator_state {
  int unanswered = 0;  ///< subscriptions still to leave without an answer
  std::vector<caf::response_promise> held;  ///< kept so that no reply (not even an error) goes out
  std::shared_ptr<std::atomic<int>> asked;
  static inline const char* name = "fake coordinator";
};

/// Answers the nonce and the status (with an error), and subscriptions after the first `unanswered`.
caf::behavior fake_coordinator(caf::stateful_actor<fake_coordinator_state>* self, int unanswered,
                               std::shared_ptr<std::atomic<int>> asked) {
  self->state.unanswered = unanswered;
  self->state.asked = std::move(asked);
  return {
      [](const nonce_request&) { return std::string("nonce"); },
      [self](subscribe_atom, const caf::actor&, const control_proof&) -> caf::result<std::string> {
        ++*self->state.asked;
        if (self->state.unanswered-- > 0) {
          self->state.held.push_back(self->make_response_promise());
          return caf::delegated<std::string>{};
        }
        return std::string("subscribed");
      },
      [](status_atom, const control_proof&) -> caf::result<job_status> {
        return caf::make_error(caf::sec::unexpected_message);
      },
  };
}

struct log_lines {
  std::mutex mu;
  std::vector<std::string> lines;
  bool has(const std::string& s) {
    std::lock_guard lock(mu);
    for (const auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
  std::string all() {
    std::lock_guard lock(mu);
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};

struct outcome {
  bool subscribed_again = false;
  int asked = 0;  ///< subscriptions the second coordinator saw
  int drops = 0;  ///< calls of drop_coordinator_link
  std::string log;
};

/// The injector subscribes to a first coordinator, which then dies; the second one found leaves
/// its first `unanswered` subscriptions without an answer. `dropped` is what drop_coordinator_link
/// returns (nullopt: the injector is given none).
outcome follow(int unanswered, std::optional<std::size_t> dropped) {
  caf::actor_system_config cfg;
  caf::actor_system sys(cfg);
  auto first_asked = std::make_shared<std::atomic<int>>(0);
  auto second_asked = std::make_shared<std::atomic<int>>(0);
  auto first = sys.spawn(fake_coordinator, 0, first_asked);
  auto second = sys.spawn(fake_coordinator, unanswered, second_asked);
  auto log = std::make_shared<log_lines>();
  auto drops = std::make_shared<std::atomic<int>>(0);

  actors::injector_deps d;
  d.coordinator = caf::actor_cast<coordinator_actor>(first);
  d.log = [log](const std::string& line) {
    std::lock_guard lock(log->mu);
    log->lines.push_back(line);
  };
  d.find_coordinator = [second]() -> std::optional<coordinator_actor> {
    return caf::actor_cast<coordinator_actor>(second);
  };
  d.grace_s = 20;
  if (dropped) {
    d.drop_coordinator_link = [drops, n = *dropped] {
      ++*drops;
      return n;
    };
    d.relink_wait = std::chrono::milliseconds(50);
  }
  auto injector = sys.spawn<caf::detached>(actors::injector, d);

  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (*first_asked == 0 && std::chrono::steady_clock::now() < by)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(*first_asked == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its answer arrives
  caf::anon_send_exit(first, caf::exit_reason::kill);

  outcome o;
  while (!(o.subscribed_again = log->has("subscribed to the coordinator at its address again")) &&
         std::chrono::steady_clock::now() < by)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  caf::anon_send_exit(injector, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(second, caf::exit_reason::kill);
  o.asked = *second_asked;
  o.drops = *drops;
  o.log = log->all();
  return o;
}

}  // namespace

TEST_CASE("injector: a coordinator found again that leaves its subscription unanswered: the connection is closed, then it subscribes") {
  const auto o = follow(1, 1);
  INFO(o.log);
  CHECK(o.subscribed_again);
  CHECK(o.asked == 2);
  CHECK(o.drops == 1);
  CHECK(o.log.find("did not take the subscription (system_error(request_timeout))") != std::string::npos);
  CHECK(o.log.find("no answer from the coordinator over the injector's connection to it: closed it (1 connection(s)), "
                   "connecting afresh") != std::string::npos);
}

TEST_CASE("injector: with no connection left to close (the request went to one that had ended), it looks again at the usual pace") {
  const auto o = follow(1, 0);
  INFO(o.log);
  CHECK(o.subscribed_again);
  CHECK(o.asked == 2);
  CHECK(o.drops == 1);
  CHECK(o.log.find("closed it") == std::string::npos);
}

TEST_CASE("injector: a coordinator found again that answers at once is subscribed to without closing anything") {
  const auto o = follow(0, 1);
  INFO(o.log);
  CHECK(o.subscribed_again);
  CHECK(o.asked == 1);
  CHECK(o.drops == 0);
}
