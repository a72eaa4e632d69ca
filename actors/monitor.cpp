#include "actors/monitor.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <caf/system_messages.hpp>
#include <caf/exit_reason.hpp>

#include "actors/admission.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

void signal_own_process(const inject_fault& f) {
  if (f.kind == fault_kind::kill) {
    ::kill(::getpid(), SIGKILL);
    return;
  }
  if (f.seconds > 0) {
    // A stopped process cannot wake itself: a child does it (async-signal-safe calls only).
    const pid_t parent = ::getpid();
    if (::fork() == 0) {
      timespec t{static_cast<time_t>(f.seconds),
                 static_cast<long>((f.seconds - static_cast<time_t>(f.seconds)) * 1e9)};
      while (::nanosleep(&t, &t) != 0) {
      }
      ::kill(parent, SIGCONT);
      ::_exit(0);
    }
  }
  ::kill(::getpid(), SIGSTOP);
}

namespace {

void start_registration(monitor_pointer self) {
  auto& d = self->state.deps;
  self->request(d.coordinator, caf::infinite, nonce_request{protocol_version})
      .then(
          [self](std::string& nonce) {
            auto& d = self->state.deps;
            register_node r{protocol_version, d.job_hash, d.name,  d.slots, d.data,
                            nonce,            admission_proof(d.token, nonce, d.name), -1};
            self->request(d.coordinator, caf::infinite, std::move(r))
                .then(
                    [self](admission& a) {
                      self->state.node = a.node;
                      self->state.deps.log("admitted as node " + std::to_string(a.node));
                      self->state.deps.admitted(a);
                    },
                    [self](caf::error& err) {
                      self->state.deps.log("refused by the coordinator: " + describe(err));
                      self->quit(std::move(err));
                    });
          },
          [self](caf::error& err) {
            self->state.deps.log("refused by the coordinator: " + describe(err));
            self->quit(std::move(err));
          });
}

}  // namespace

monitor_actor::behavior_type monitor(monitor_pointer self, monitor_deps deps) {
  self->state.deps = std::move(deps);
  if (!self->state.deps.fault) self->state.deps.fault = signal_own_process;
  self->monitor(self->state.deps.coordinator);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source != self->state.deps.coordinator.address()) return;
    self->state.deps.log("the coordinator is gone (" + self->system().render(dm.reason) +
                         "); stopping");
    self->quit(caf::make_error(caf::exit_reason::remote_link_unreachable));
  });
  start_registration(self);
  return {
      [self](inject_fault& f) {
        self->state.deps.log("injected fault: " + to_string(f.kind) +
                             (f.seconds > 0 ? " for " + std::to_string(f.seconds) + " s" : ""));
        self->state.deps.fault(f);
      },
      [self](shutdown_atom, std::string& reason) {
        self->state.deps.log("shut down by the coordinator: " + reason);
        self->quit();
      },
  };
}

}  // namespace oobleck::actors
