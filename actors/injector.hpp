#pragma once
// The failure injector: a small actor of the kind users write to extend Oobleck. It subscribes to
// the coordinator's events (proving the job token) and hands every scheduled fault to the
// coordinator, which delivers it to its node's monitor (at once for a live node; on admission,
// before the node's first epoch assignment, for one that has not joined yet). The monitor arms
// it for the middle of that step (kill: SIGKILL of the node's own process; hang: SIGSTOP).
// `handed_over` counts the faults the coordinator took: a caller that waits for all of them
// before starting the workers knows every fault is armed before its step.
//
// The coordinator may go away before the job stopped (killed, or frozen past the connection
// timeout) and be replaced (oobleck-local restarts it at the same address). A fault already
// delivered is armed in its worker, which keeps it while it waits for a coordinator; a fault the
// lost coordinator still held for a node yet to join died with it. With `find_coordinator` set,
// the injector looks for a coordinator for `grace_s`, subscribes to the one that answers, and
// hands it the faults whose node had not joined (none when it is the same coordinator process,
// woken from a freeze: it still holds them), after reading from its status what it published
// while the injector was away. Faults are counted per worker (see injector_state).
//
//   subscribing --(subscribed)--> handing over --(node_lost events)--> stopped: count unfired
//        ^                              |
//        +--(found one)-- looking <--(the coordinator's down_msg, before a stop)
//                            \--(grace over, or an exit from the composition root)--> stopped: count unfired

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "messages/actor_interfaces.hpp"

namespace oobleck::actors {

struct injector_deps {
  messages::coordinator_actor coordinator;
  std::string token;
  std::vector<messages::inject_fault> faults;  ///< each with its node and at_step
  std::function<void(const std::string&)> log = [](const std::string&) {};
  /// Faults not seen to fire (their node never lost) when the job stopped; the composition root
  /// reads it after the job so that a fault that could not fire is not silently a success.
  std::shared_ptr<std::atomic<int>> unfired = std::make_shared<std::atomic<int>>(0);
  /// Faults the coordinator has taken (for a live node, or kept for one yet to join); each counts
  /// once, however many coordinators took it.
  std::shared_ptr<std::atomic<int>> handed_over = std::make_shared<std::atomic<int>>(0);
  /// One attempt to reach a coordinator (a replacement, or the same one back): nullopt when none
  /// answered. It blocks (a connection attempt), so an injector given one is spawned detached.
  /// Unset: the injector ends with its coordinator.
  std::function<std::optional<messages::coordinator_actor>()> find_coordinator;
  /// How long to look for a coordinator after losing one (oobleck-local: --coordinator-grace).
  double grace_s = 60;
  /// With find_coordinator: closes this process's connections to the coordinator's address and
  /// returns how many, as a worker's monitor does (actors/monitor.hpp): a subscription over a
  /// connection that completed CAF's handshake and got no answer at all went over a connection
  /// whose route CAF 0.17 lost on the coordinator's side (apps/coordinator_link.hpp), and every
  /// later attempt would reuse it. The injector then looks again after `relink_wait`, or at the
  /// usual pace when no connection was left to close. Unset: it looks again over the same one.
  std::function<std::size_t()> drop_coordinator_link;
  std::chrono::milliseconds relink_wait{500};
};

struct injector_state {
  injector_deps deps;
  /// Workers by name: a coordinator that was frozen past the timeout loses every node, adopts them
  /// back and gives them new ids, so a fault's node is followed as its worker (named by the
  /// node_joined of the fault's id, at the first coordinator). A worker is lost while its last
  /// event is a loss (one that comes back, from a freeze, is not).
  std::map<std::int64_t, std::string> name_of;  ///< node id -> worker name, of the current coordinator
  std::vector<std::string> fault_worker;        ///< per fault ("" until its node joined)
  std::set<std::string> lost_workers;
  std::set<std::string> failed_workers;  ///< named by a step_failed event (error and stall faults fire so)
  /// Per fault: delivered to its node (which keeps it armed across coordinators), and the
  /// coordinator (1, 2, ... in the order subscribed to) that last took it (0: none yet).
  std::vector<bool> delivered;
  std::vector<int> taken_by;
  int incarnation = 1;                   ///< the coordinator subscribed to (or being subscribed to)
  std::set<std::int64_t> joined_here;    ///< node_joined events of that coordinator
  /// Looking for a coordinator until then (set from the down_msg until one is subscribed to).
  std::optional<std::chrono::steady_clock::time_point> looking_until;
  bool stopped = false;
  int failed_attempts = 0;  ///< subscriptions a coordinator found did not take (logged now and then)
  static inline const char* name = "oobleck.injector";
};

caf::behavior injector(caf::stateful_actor<injector_state>* self, injector_deps deps);

}  // namespace oobleck::actors
