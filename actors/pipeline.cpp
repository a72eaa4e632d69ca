#include "actors/pipeline.hpp"

#include <caf/event_based_actor.hpp>

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

void finish_stage(pipeline_pointer self, std::uint64_t step, const stage_done* done,
                  const std::string& error) {
  auto& st = self->state;
  if (!st.running || step != st.step) {
    ++st.dropped;  // a late answer of an abandoned step
    return;
  }
  if (done) {
    st.loss_sum += done->loss_sum;
    if (done->timing.busy_ms.value >= st.slowest.busy_ms.value) st.slowest = done->timing;
  }
  if (!error.empty() && st.error.empty()) st.error = error;
  if (--st.pending > 0) return;
  st.running = false;
  self->send(st.deps.coordinator,
             pipeline_done{st.deps.epoch, st.step, st.deps.index, st.loss_sum, st.error, st.slowest});
}

}  // namespace

pipeline_actor::behavior_type pipeline(pipeline_pointer self, pipeline_deps deps) {
  self->state.deps = std::move(deps);
  return {
      [self](run_step& r) {
        auto& st = self->state;
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
        const stage_step order{r.epoch, r.step, st.deps.first_microbatch, st.deps.microbatches};
        for (std::size_t s = 0; s < st.deps.stages.size(); ++s) {
          // A stage's step may take minutes; its loss is a down message or an error, not a timeout.
          self->request(st.deps.stages[s], caf::infinite, order)
              .then(
                  [self, step = r.step](stage_done& d) {
                    if (d.epoch != self->state.deps.epoch || d.step != step) {
                      ++self->state.dropped;
                      return;
                    }
                    finish_stage(self, step, &d, d.error);
                  },
                  [self, step = r.step, s](caf::error& e) {
                    finish_stage(self, step, nullptr,
                                 "stage " + std::to_string(s) + ": " + self->system().render(e));
                  });
        }
      },
  };
}

}  // namespace oobleck::actors
