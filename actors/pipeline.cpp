#include "actors/pipeline.hpp"

#include <caf/actor_cast.hpp>
#include <caf/atom.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

#include <algorithm>

#include "planning/makespan.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

void finish_stage(pipeline_pointer self, std::uint64_t step, std::size_t s, const stage_done* done,
                  const std::string& error) {
  auto& st = self->state;
  if (!st.running || step != st.step) {
    ++st.dropped;  // a late answer of an abandoned step
    return;
  }
  if (done) {
    st.loss_sum += done->loss_sum;
    if (done->timing.busy_ms.value >= st.slowest.busy_ms.value) st.slowest = done->timing;
    st.grad_sq.at(s) = done->grad_sq.value;
    // Op times of this pipeline's microbatches only (a stage that sends other counts leaves the
    // step's ideal unknown).
    const auto m = static_cast<std::size_t>(st.deps.microbatches);
    if (done->forward_ms.size() == m && done->backward_ms.size() == m) {
      for (std::size_t i = 0; i < m; ++i) {
        st.forward_ms.at(s).push_back(std::max(0.0, done->forward_ms[i].value));
        st.backward_ms.at(s).push_back(std::max(0.0, done->backward_ms[i].value));
      }
    }
    st.allreduce_ms = std::max(st.allreduce_ms, done->timing.allreduce_ms.value);
  }
  if (!error.empty() && st.error.empty()) st.error = error;
  if (--st.pending > 0) return;
  st.running = false;
  double grad_sq = 0;
  for (double g : st.grad_sq) grad_sq += g;  // in stage order, whatever order the answers came in
  double ideal_ms = 0;
  const auto m = static_cast<std::size_t>(st.deps.microbatches);
  const auto complete = [m](const std::vector<double>& times) { return m > 0 && times.size() == m; };
  if (!st.eval && st.error.empty() && std::all_of(st.forward_ms.begin(), st.forward_ms.end(), complete) &&
      std::all_of(st.backward_ms.begin(), st.backward_ms.end(), complete))
    ideal_ms = planning::one_f_one_b_makespan(st.forward_ms, st.backward_ms) + st.allreduce_ms;
  self->send(st.deps.coordinator, pipeline_done{st.deps.epoch, st.step, st.deps.index, st.loss_sum, st.error,
                                                st.slowest, grad_sq, st.eval, ideal_ms});
}

bool sent_by(pipeline_pointer self, const caf::actor_addr& who) {
  const auto& sender = self->current_sender();
  return sender && who && sender->address() == who;
}

/// An error the runtime made itself (a request bounced: its receiver or the connection is gone);
/// it has no sender.
bool runtime_error(pipeline_pointer self, const caf::error& e) {
  return !self->current_sender() && (e.category() == caf::atom("exit") || e.category() == caf::atom("system"));
}

/// Waits for stage `s`'s answer to request `mid` (step `step`): an answer from any other actor is
/// refused and the same wait is armed again, so the stage's own answer still finds it.
void await_stage(pipeline_pointer self, caf::message_id mid, std::size_t s, std::uint64_t step) {
  auto refuse = [self, mid, s, step] {
    ++self->state.refused;
    await_stage(self, mid, s, step);
  };
  self->add_multiplexed_response_handler(
      mid, caf::behavior{
               [self, s, step, refuse](stage_done& d) {
                 if (!sent_by(self, self->state.deps.stages[s].address())) return refuse();
                 if (d.epoch != self->state.deps.epoch || d.step != step) {
                   ++self->state.dropped;
                   return;
                 }
                 finish_stage(self, step, s, &d, d.error);
               },
               [self, s, step, refuse](caf::error& e) {
                 if (!sent_by(self, self->state.deps.stages[s].address()) && !runtime_error(self, e)) return refuse();
                 finish_stage(self, step, s, nullptr, "stage " + std::to_string(s) + ": " + self->system().render(e));
               },
           });
}

}  // namespace

pipeline_actor::behavior_type pipeline(pipeline_pointer self, pipeline_deps deps) {
  self->state.deps = std::move(deps);
  return {
      [self](messages::run_step& r) {
        auto& st = self->state;
        if (!sent_by(self, caf::actor_cast<caf::actor_addr>(st.deps.coordinator))) {
          ++st.refused;
          return;
        }
        if (r.epoch != st.deps.epoch) {
          ++st.dropped;
          return;
        }
        st.step = r.step;
        st.running = true;
        st.pending = st.deps.stages.size();
        st.loss_sum = 0;
        st.error.clear();
        st.slowest = {};
        st.eval = r.eval;
        st.grad_sq.assign(st.deps.stages.size(), 0.0);
        st.forward_ms.assign(st.deps.stages.size(), {});
        st.backward_ms.assign(st.deps.stages.size(), {});
        st.allreduce_ms = 0;
        stage_step order = r.eval ? stage_step{r.epoch, r.step, r.first_window, r.windows, true}
                                  : stage_step{r.epoch, r.step, st.deps.first_microbatch, st.deps.microbatches};
        // Orders that ride with the previous step's commit: every stage applies it first.
        if (!r.eval && r.commit_first) {
          order.commit_first = true;
          order.commit = r.commit;
        }
        for (std::size_t s = 0; s < st.deps.stages.size(); ++s) {
          // A stage's step may take minutes; its loss is a down message or an error, not a timeout.
          const auto mid = self->request(st.deps.stages[s], caf::infinite, order).id();
          await_stage(self, mid, s, r.step);
        }
      },
  };
}

}  // namespace oobleck::actors
