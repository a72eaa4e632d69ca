#include "actors/monitor.hpp"

#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <caf/exit_reason.hpp>

#include <limits>

#include "actors/admission.hpp"
#include "actors/monitor_detail.hpp"

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
  // To this thread, not the process: a process-directed stop is taken by whichever thread the
  // kernel wakes (usually the main one), and until it does, this thread runs on and may finish
  // the step it should have frozen in the middle of (seen: its stage_done sent and the step
  // committed). A thread-directed SIGSTOP still stops every thread, this one first.
  ::syscall(SYS_tgkill, ::getpid(), ::syscall(SYS_gettid), SIGSTOP);
}

namespace monitor_detail {

void retire_stage(monitor_pointer self, const std::string& why) {
  auto& st = self->state;
  if (!st.stage) return;
  st.stage->abort(std::numeric_limits<std::uint64_t>::max(), why);
  auto slots = st.stage->runners;
  slots.insert(slots.begin(), st.stage->actor);
  for (const auto& slot : slots) {
    caf::anon_send_exit(slot, caf::exit_reason::user_shutdown);
    // The stage's handle went to the coordinator in node_ready, which put the stage into this
    // system's registry (so remote nodes can address it); CAF 0.17 does not always take it out
    // when the actor ends, and the registry's reference keeps the detached stage's thread, hence
    // the actor system's destructor, waiting forever (workers hung on exit).
    self->system().registry().erase(slot.id());
  }
  st.stage.reset();
}

void start_stage(monitor_pointer self) {
  auto& st = self->state;
  if (!st.deps.make_stage) return;
  try {
    st.stage = st.deps.make_stage(st.job);
  } catch (const std::exception& e) {
    st.deps.log(std::string("cannot start a stage: ") + e.what());
    return;
  }
  // A stage's own failure is reported as this monitor's (the coordinator accepts node messages
  // only from the node's monitor), from the failing stage's thread. Weak: the stage runtime must
  // not keep its monitor alive.
  if (st.stage->report_failures_to) {
    const caf::actor_addr me = self->address();
    st.stage->report_failures_to([me, target = st.failures, log = st.deps.log](
                                     std::uint64_t epoch, const std::string& what, bool in_commit) {
      log("epoch " + std::to_string(epoch) + ": this node's stage failed: " + what);
      std::lock_guard lock(target->mu);
      if (auto monitor = caf::actor_cast<caf::actor>(me))
        caf::send_as(monitor, target->coordinator, node_fault{epoch, target->node, what, true, in_commit});
    });
  }
  if (st.stage->report_commits_to) {
    const caf::actor_addr me = self->address();
    st.stage->report_commits_to([me](std::uint64_t epoch, std::uint64_t step) {
      if (auto monitor = caf::actor_cast<caf::actor>(me)) caf::anon_send(monitor, applied_atom_v, epoch, step);
    });
  }
}

}  // namespace monitor_detail

namespace {

using namespace monitor_detail;

void on_assignment(monitor_pointer self, epoch_assignment& a) {
  auto& st = self->state;
  if (a.epoch <= st.epoch || st.node.value < 0 || a.term < st.term) {
    ++st.dropped;  // stale, of a replaced coordinator, or (a protocol error) ahead of this node's admission
    return;
  }
  st.epoch = a.epoch;
  st.term = std::max(st.term, a.term);
  st.job_nodes = a.job_nodes;
  node_role role{a.epoch, st.node.value, -1, {}};
  if (a.rank != planning::no_rank && !a.stages.empty()) {
    const auto& s0 = a.stages.front();
    role.pipeline = s0.pipeline;
    for (auto r = s0.first_rank.value; r <= s0.last_rank.value && r >= 0; ++r)
      if (static_cast<std::size_t>(r) < a.rank_nodes.size()) role.nodes.push_back(a.rank_nodes[static_cast<std::size_t>(r)]);
  }
  st.roles.push_back(std::move(role));
  while (st.roles.size() > 8) st.roles.pop_front();
  if (!st.stage) {
    if (a.rank == planning::no_rank) {
      self->send(st.deps.coordinator, node_ready{a.epoch, st.node, {}});
    } else {
      self->send(st.deps.coordinator, node_fault{a.epoch, st.node, "this node cannot run stages"});
    }
    return;
  }
  // Slot j runs the node's stage j: one stage actor per stage, each on a thread of its own.
  const std::size_t slots = 1 + st.stage->runners.size();
  if (a.stages.size() > slots) {
    const std::string why = "the epoch gives this node " + std::to_string(a.stages.size()) + " stages; it has " +
                            std::to_string(slots) + " slot(s)";
    st.deps.log("epoch " + std::to_string(a.epoch) + ": " + why);
    self->send(st.deps.coordinator, node_fault{a.epoch, st.node, why});
    return;
  }
  if (a.rank == planning::no_rank) {
    st.deps.log("epoch " + std::to_string(a.epoch) + ": idle");
  } else if (a.stages.empty()) {
    st.deps.log("epoch " + std::to_string(a.epoch) + ": rank " + std::to_string(a.rank.value) + ", sends copies only");
  } else {
    for (const auto& s : a.stages)
      st.deps.log("epoch " + std::to_string(a.epoch) + ": rank " + std::to_string(a.rank.value) + ", pipeline " +
                  std::to_string(s.pipeline) + " stage " + std::to_string(s.stage) + " of " +
                  std::to_string(s.num_stages) + ", layers [" + std::to_string(s.first_layer.value) + ", " +
                  std::to_string(s.end_layer.value) + ")" + (s.width > 1 ? ", width " + std::to_string(s.width) : ""));
  }
  const std::uint64_t e = a.epoch;
  const std::size_t runs_stages = a.rank != planning::no_rank ? a.stages.size() : 0;
  self->request(st.stage->actor, caf::infinite, std::move(a))
      .then(
          [self, e, runs_stages](form_timing& timing) {
            auto& st = self->state;
            if (e != st.epoch || !st.stage) return;
            std::vector<caf::actor> stages;
            for (std::size_t j = 0; j < runs_stages; ++j)
              stages.push_back(caf::actor_cast<caf::actor>(j == 0 ? st.stage->actor : st.stage->runners.at(j - 1)));
            self->send(st.deps.coordinator, node_ready{e, st.node, std::move(stages), timing});
          },
          [self, e](caf::error& err) {
            auto& st = self->state;
            if (e != st.epoch) return;
            st.deps.log("epoch " + std::to_string(e) + ": forming failed: " + describe(err));
            self->send(st.deps.coordinator, node_fault{e, st.node, describe(err)});
          });
}

/// The node applied commit `c`: what a replacement coordinator will ask of it.
void note_committed(monitor_state& st, const commit_step& c) {
  st.committed_step = static_cast<std::int64_t>(c.step);
  st.committed_epoch = c.epoch;
  st.committed_scale = c.grad_scale.value;
  st.committed_at = std::chrono::steady_clock::now();
}

/// Sends the node's answer to commit `c` to the coordinator.
void answer_commit(monitor_pointer self, const commit_step& c, step_committed done) {
  auto& st = self->state;
  note_committed(st, c);
  done.node = st.node;
  self->send(st.deps.coordinator, std::move(done));
}

/// Whether commit (epoch, step) is the one this monitor awaits (and has not answered).
bool awaiting(const monitor_state& st, std::uint64_t epoch, std::uint64_t step) {
  return st.awaiting_commit && st.awaiting_commit->epoch == epoch && st.awaiting_commit->step == step;
}

/// The awaited commit (epoch, step) is applied: answered now, once.
void answer_awaited(monitor_pointer self, std::uint64_t epoch, std::uint64_t step) {
  auto& st = self->state;
  if (!awaiting(st, epoch, step) || !st.stage || !st.stage->applied) return;
  auto done = st.stage->applied(epoch, step);
  if (!done) return;
  const commit_step c = *st.awaiting_commit;
  st.awaiting_commit.reset();
  answer_commit(self, c, std::move(*done));
}

void on_commit(monitor_pointer self, commit_step& c) {
  auto& st = self->state;
  if (c.epoch != st.epoch) {
    ++st.dropped;
    return;
  }
  if (!st.stage) {
    note_committed(st, c);
    self->send(st.deps.coordinator, step_committed{c.epoch, c.step, st.node, {}});
    return;
  }
  const bool awaited = c.with_run && st.stage->applied;  // stages built by spawn_stage
  if (awaited) {
    // The next step's orders ride with this commit: a stage may have applied it already, or
    // will, and nudges this monitor (applied_atom). Slot 0 still gets it below, so that it is
    // applied before anything this monitor sends slot 0 later (a new epoch), whatever happens
    // to the orders; its reply then answers only if the nudge did not.
    st.awaiting_commit = c;
    answer_awaited(self, c.epoch, c.step);
    if (!st.awaiting_commit) return;
  }
  self->request(st.stage->actor, caf::infinite, c)
      .then(
          [self, c, awaited](step_committed& done) {
            auto& st = self->state;
            if (awaited) {
              if (!awaiting(st, c.epoch, c.step)) return;  // answered when a stage applied it
              if (c.digests && done.digests.empty()) {
                // Its digests are computed while the next step runs: ready now, or their thread
                // nudges this monitor once they are (answer_awaited).
                if (auto ready = st.stage->applied(c.epoch, c.step)) done = std::move(*ready);
                else if (st.stage->digests_coming && st.stage->digests_coming(c.epoch, c.step)) return;
              }
              st.awaiting_commit.reset();
            }
            answer_commit(self, c, std::move(done));
          },
          [self, c](caf::error& err) {
            self->send(self->state.deps.coordinator,
                       node_fault{c.epoch, self->state.node, "commit failed: " + describe(err)});
          });
}

/// Writes the node's layers into a checkpoint (its stage holds them); the reply goes to the
/// coordinator with this node's id.
void on_write_checkpoint(monitor_pointer self, write_checkpoint& w) {
  auto& st = self->state;
  if (!st.stage) {
    self->send(st.deps.coordinator, checkpoint_written{w.request, st.node, {}, w.layers, {}});
    return;
  }
  const auto request = w.request;
  self->request(st.stage->actor, caf::infinite, std::move(w))
      .then(
          [self](checkpoint_written& done) {
            done.node = self->state.node;
            self->send(self->state.deps.coordinator, std::move(done));
          },
          [self, request](caf::error& err) {
            self->send(self->state.deps.coordinator,
                       checkpoint_written{request, self->state.node, {}, {}, "writing the checkpoint: " + describe(err)});
          });
}

}  // namespace

monitor_actor::behavior_type monitor(monitor_pointer self, monitor_deps deps) {
  using namespace monitor_detail;
  self->state.deps = std::move(deps);
  if (!self->state.deps.fault) self->state.deps.fault = signal_own_process;
  self->monitor(self->state.deps.coordinator);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source != self->state.deps.coordinator.address()) return;
    // Either the coordinator stopped, or it stopped hearing this node (a hang longer than the
    // heartbeat timeout) and declared it lost: the job has moved on without it (fencing), and
    // its stage's old epoch is aborted so nothing of it touches the data plane again.
    auto& st = self->state;
    if (st.orphaned_until) return;  // already looking (a registration under way fails on its own)
    if (!st.deps.find_coordinator) {
      st.deps.log("lost contact with the coordinator (" + self->system().render(dm.reason) +
                  "): it stopped, or it declared this node lost; stopping");
      retire_stage(self, "lost contact with the coordinator");
      return self->quit(caf::make_error(caf::exit_reason::remote_link_unreachable));
    }
    if (st.node.value < 0) {
      // Not admitted yet, so nothing to keep: it registers afresh with whichever coordinator it
      // reaches (the request under way, if any, fails on its own).
      st.deps.log("lost contact with the coordinator before it admitted this node (" + self->system().render(dm.reason) +
                  "): looking for a coordinator for " + std::to_string(st.deps.grace_s) + " s");
    } else {
      // The node outlives its coordinator (ARCHITECTURE.md §10 "Coordinator loss"): its data plane
      // stops at once (no peer waits on it), its layers and a finished step's gradients stay, and it
      // looks for a coordinator (the same one back, or a replacement) for the grace period.
      st.deps.log("lost contact with the coordinator (" + self->system().render(dm.reason) + "): keeping this node's " +
                  "state and looking for a coordinator for " + std::to_string(st.deps.grace_s) + " s");
      if (st.stage) st.stage->abort(st.epoch, "lost contact with the coordinator");
    }
    start_looking(self);
  });
  start_registration(self);
  return {
      [self](epoch_assignment& a) { on_assignment(self, a); },
      [self](commit_step& c) { on_commit(self, c); },
      [self](applied_atom, std::uint64_t epoch, std::uint64_t step) { answer_awaited(self, epoch, step); },
      [self](write_checkpoint& w) { on_write_checkpoint(self, w); },
      [self](abort_epoch& a) {
        // At once, from this thread: the stage may be blocked in a collective with a dead peer.
        if (self->state.stage) self->state.stage->abort(a.epoch, a.reason);
        self->send(self->state.deps.coordinator, epoch_aborted{a.epoch, self->state.node});
      },
      [self](inject_fault& f) {
        auto& st = self->state;
        const std::string what = to_string(f.kind) + (f.seconds > 0 ? " for " + std::to_string(f.seconds) + " s" : "");
        // Error and stall happen inside a stage's step (the next one when no step is named).
        const bool in_stage = f.kind == fault_kind::error || f.kind == fault_kind::stall;
        if ((f.at_step >= 0 || in_stage) && st.stage && st.stage->arm) {
          st.deps.log("fault armed: " + what + " in the middle of " +
                      (f.at_step >= 0 ? "step " + std::to_string(f.at_step) : std::string("the next step")) +
                      (in_stage ? (f.attempts > 0 ? ", at most " + std::to_string(f.attempts) + " attempt(s)"
                                                  : ", every attempt")
                                : ""));
          auto log = st.deps.log;
          auto act = st.deps.fault;
          st.stage->arm(f, [log, act, what, in_stage](const inject_fault& x) {
            log("injected fault: " + what + " (step " + std::to_string(x.at_step) + ")");
            if (!in_stage) act(x);  // the stage throws or stalls itself
          });
          return;
        }
        if (in_stage) {
          st.deps.log("cannot inject " + what + ": this node runs no stage");
          return;
        }
        st.deps.log("injected fault: " + what);
        st.deps.fault(f);
      },
      [self](shutdown_atom, std::string& reason) {
        self->state.deps.log("shut down by the coordinator: " + reason);
        retire_stage(self, "shut down: " + reason);
        self->quit();
      },
      [self](stall_probe& p) {
        auto& st = self->state;
        stall_report r;
        if (st.stage && st.stage->activity) r = st.stage->activity();
        r.probe = p.probe;
        r.node = st.node;
        self->send(st.deps.coordinator, r);
      },
      // Whether this node still follows its coordinator: false while it looks for one after losing
      // it (the coordinator asking was frozen or cut off, and this node has reached it again).
      [self](ping_atom) { return !self->state.orphaned_until.has_value(); },
      [self](profile_atom) -> caf::result<std::string> {
        auto& st = self->state;
        if (!st.deps.profile_job || st.job.node.value < 0)
          return make_error(protocol_error::bad_request, "this node cannot profile the job's model");
        // Seconds of compute on this actor's own thread (the worker's monitor is detached). Nothing
        // else is asked of the node before its first epoch; CAF's heartbeats run on the middleman.
        st.deps.log("profiling the job's model for the coordinator");
        try {
          return st.deps.profile_job(st.job);
        } catch (const std::exception& e) {
          return make_error(protocol_error::bad_request, std::string("profiling failed: ") + e.what());
        }
      },
      [self](reconnect_atom) {
        auto& st = self->state;
        if (!st.orphaned_until) return;
        if (auto found = st.deps.find_coordinator ? st.deps.find_coordinator() : std::nullopt) {
          // (The same coordinator back, woken or reconnected, has the same address: a new proxy.)
          st.deps.coordinator = *found;
          self->monitor(st.deps.coordinator);
          if (st.node.value < 0) {  // never admitted: a first registration
            st.orphaned_until.reset();
            st.deps.log("reached a coordinator: registering");
            return start_registration(self);
          }
          st.deps.log("reached a coordinator: coming back with this node's state");
          return rejoin(self);
        }
        look_for_coordinator(self);
      },
      [self](evict_atom, std::string& why) {
        // The coordinator declared this node lost for failing or stalling again and again: the job
        // goes on without it. A stage stuck in compute cannot be stopped; the process exits anyway.
        self->state.deps.log("evicted by the coordinator: " + why);
        retire_stage(self, "evicted: " + why);
        self->quit(make_error(protocol_error::evicted, why));
      },
  };
}

}  // namespace oobleck::actors
