// The monitor's standing with a coordinator (actors/monitor_detail.hpp): the first registration
// and, when the coordinator is lost, looking for one (the same back, or a replacement) for the
// grace period, then coming back with what the node kept (ARCHITECTURE.md §10, "Coordinator loss").
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <chrono>
#include <optional>

#include "actors/admission.hpp"
#include "actors/monitor_detail.hpp"

namespace oobleck::actors::monitor_detail {

using namespace oobleck::messages;

namespace {

void admitted(monitor_pointer self, admission& a) {
  auto& st = self->state;
  const bool first = st.node.value < 0;
  st.node = a.node;
  st.job = a;
  st.term = std::max(st.term, a.term);
  {
    std::lock_guard lock(st.failures->mu);
    st.failures->coordinator = st.deps.coordinator;
    st.failures->node = a.node;
  }
  if (first) {
    start_stage(self);
    st.committed_at = std::chrono::steady_clock::now();
    st.deps.log("admitted as node " + std::to_string(a.node.value));
    st.deps.admitted(a);
  } else {
    st.orphaned_until.reset();
    st.deps.log("adopted by the coordinator (term " + std::to_string(a.term) + ") as node " +
                std::to_string(a.node.value));
    if (st.deps.announce_term) st.deps.announce_term(a.term, st.deps.coordinator);
  }
}

/// The coordinator went away while a request to it was pending (not a refusal).
bool coordinator_gone(const caf::error& err) {
  return err == caf::sec::request_receiver_down || err == caf::exit_reason::remote_link_unreachable;
}

/// A request over a connection that completed CAF's handshake got no answer at all (the nonce a
/// live coordinator answers at once, or the registration): the coordinator froze, or CAF lost the
/// connection's route on its side (apps/coordinator_link.hpp). With deps.drop_coordinator_link the
/// node closes its end, so that its next attempt connects afresh, and says so; returns how long to
/// wait before that attempt: relink_wait when it closed a connection, none when the connection had
/// already ended (the request went out over a connection of a coordinator that had just died,
/// still cached by CAF: the next attempt at the usual pace finds a new one). Nullopt where it is
/// not a timeout or the node cannot drop the link.
std::optional<std::chrono::milliseconds> unanswered(monitor_pointer self, const caf::error& err) {
  auto& d = self->state.deps;
  const auto dropped = drop_unanswered_link(err, d.drop_coordinator_link, d.log, "this node's");
  if (!dropped) return std::nullopt;
  if (*dropped > 0) return d.relink_wait;
  d.log("no answer from the coordinator: the connection it went over had already ended; looking again");
  return std::chrono::milliseconds{0};
}

/// A first registration failed: the node stops with the coordinator's refusal, or, when the
/// coordinator went away before it answered (its connection lost under load, a crash) or never
/// answered, looks for one (the same back, or another address), as an admitted node does.
void registration_failed(monitor_pointer self, caf::error err) {
  auto& d = self->state.deps;
  if (d.find_coordinator) {
    if (const auto wait = unanswered(self, err)) {
      start_looking(self, *wait);
      return;
    }
  }
  if (coordinator_gone(err)) {
    const bool looking = self->state.orphaned_until.has_value();  // its loss was heard first
    if (start_looking(self)) {
      if (!looking)
        d.log("lost the coordinator before it admitted this node (" + describe(err) + "): looking for a coordinator for " +
            std::to_string(d.grace_s) + " s");
      return;
    }
  }
  d.log("refused by the coordinator: " + describe(err));
  self->quit(std::move(err));
}

}  // namespace

bool start_looking(monitor_pointer self, std::chrono::milliseconds first_after) {
  auto& st = self->state;
  if (!st.deps.find_coordinator) return false;
  if (st.orphaned_until) return true;  // a reconnect_atom is on its way
  st.orphaned_at = std::chrono::steady_clock::now();
  st.orphaned_until = st.orphaned_at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(st.deps.grace_s));
  if (first_after.count() > 0)
    self->delayed_send(self, first_after, reconnect_atom_v);
  else
    self->send(self, reconnect_atom_v);
  return true;
}

void start_registration(monitor_pointer self, node_memory memory) {
  auto& d = self->state.deps;
  const bool rejoining = memory.present;
  // Coming back, a reply may never come: the connection the middleman hands out right after the
  // loss can be the lost coordinator's, until it notices that one is gone (then a nonce, which a
  // live coordinator answers at once, times out quickly), or the coordinator froze again. The
  // node then looks again.
  const caf::duration wait = rejoining ? caf::duration{std::chrono::seconds(5)} : caf::duration{caf::infinite};
  // A first registration that can look again (find_coordinator, drop_coordinator_link) waits 10 s
  // for its nonce, then connects afresh; one that cannot waits as long as it takes.
  const bool can_relink = d.find_coordinator && d.drop_coordinator_link;
  const caf::duration nonce_wait = rejoining    ? caf::duration{std::chrono::milliseconds(500)}
                                   : can_relink ? caf::duration{std::chrono::seconds(10)}
                                                : caf::duration{caf::infinite};
  // Only the newest attempt speaks for the node. An older one ends when its request does, which
  // can be long after a newer one was answered: a first registration's nonce request over a
  // connection whose route CAF lost times out 10 s later, by when the node may train under
  // another coordinator; acting on that timeout closed the connection to the coordinator in force
  // and took the node away from it (the coordinator-loss e2e test with a standby, once). An older
  // attempt's admission still counts while nothing newer has been answered.
  const std::uint64_t attempt = ++self->state.registration_attempt;
  const auto superseded = [self, attempt] { return attempt != self->state.registration_attempt; };
  const auto settled = [self, rejoining] {
    const auto& st = self->state;
    return rejoining ? !st.orphaned_until.has_value() : st.node.value >= 0;
  };
  self->request(d.coordinator, nonce_wait, nonce_request{protocol_version})
      .then(
          [self, wait, superseded, settled, memory = std::move(memory)](std::string& nonce) mutable {
            if (superseded() || settled()) return;
            auto& d = self->state.deps;
            register_node r{protocol_version, d.job_hash, d.name,  d.slots, d.device, d.data,
                            nonce,            admission_proof(d.token, nonce, d.name), memory.node, std::move(memory)};
            r.device_index = d.device_index;
            const bool rejoining = r.memory.present;
            self->request(d.coordinator, wait, std::move(r))
                .then(
                      [self, settled](admission& a) {
                        if (settled()) return;  // a newer attempt was answered first
                        ++self->state.registration_attempt;  // any other attempt under way is over
                        admitted(self, a);
                      },
                      [self, rejoining, superseded](caf::error& err) {
                        if (superseded()) return;
                        if (!rejoining) return registration_failed(self, std::move(err));
                        if (const auto wait = unanswered(self, err)) return look_for_coordinator(self, *wait);
                        self->state.deps.log("refused by the coordinator: " + describe(err));
                        const bool removed = is_protocol_error(err) &&
                                             err.code() == static_cast<std::uint8_t>(protocol_error::unknown_node);
                        if (removed) {
                          retire_stage(self, "refused by the coordinator");
                          return self->quit(std::move(err));
                        }
                        look_for_coordinator(self);  // maybe another one, until the grace ends
                      });
          },
          [self, rejoining, superseded](caf::error& err) {
            if (superseded()) return;
            if (!rejoining) return registration_failed(self, std::move(err));
            if (const auto wait = unanswered(self, err)) return look_for_coordinator(self, *wait);
            self->state.deps.log("refused by the coordinator: " + describe(err));
            look_for_coordinator(self);
          });
}

void rejoin(monitor_pointer self) {
  auto& st = self->state;
  auto send = [self](node_memory m) {
    auto& st = self->state;
    m.present = true;
    m.term = st.term;
    m.node = st.node.value;
    m.epoch = st.epoch;
    m.committed_step = st.committed_step;
    m.committed_epoch = st.committed_epoch;
    m.grad_scale = st.committed_scale;
    m.roles.assign(st.roles.begin(), st.roles.end());
    m.job_nodes = st.job_nodes;
    m.ms_since_commit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                              st.committed_at)
                            .count();
    start_registration(self, std::move(m));
  };
  if (!st.stage) return send({});
  self->request(st.stage->actor, std::chrono::seconds(30), memory_atom_v)
      .then([send](node_memory& m) { send(std::move(m)); },
            [self, send](caf::error& err) {
              self->state.deps.log("the stage could not say what it kept (" + describe(err) + "): coming back without layers");
              send({});
            });
}

void look_for_coordinator(monitor_pointer self, std::chrono::milliseconds at_least) {
  auto& st = self->state;
  if (!st.orphaned_until) return;
  if (std::chrono::steady_clock::now() >= *st.orphaned_until) {
    st.deps.log("no coordinator came back within " + std::to_string(st.deps.grace_s) + " s; stopping");
    retire_stage(self, "lost contact with the coordinator");
    return self->quit(caf::make_error(caf::exit_reason::remote_link_unreachable));
  }
  // Often at first (a replacement listens within tens of milliseconds of a crash), then calmly.
  const bool early = std::chrono::steady_clock::now() - st.orphaned_at < std::chrono::seconds(2);
  self->delayed_send(self, std::max(at_least, std::chrono::milliseconds(early ? 50 : 250)), reconnect_atom_v);
}

}  // namespace oobleck::actors::monitor_detail
