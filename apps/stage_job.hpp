#pragma once
// What a worker's stages take from the job file. One function, used by oobleck-worker and by the
// tests that compare a cluster run with the single-process run of the same job.

#include "actors/stage.hpp"
#include "apps/job_file.hpp"

namespace oobleck::apps {

inline actors::stage_job stage_job_for(const job_file& job) {
  actors::stage_job s;
  s.model = job.model;
  s.global_batch = job.training.global_batch;
  s.microbatch = job.training.microbatch;
  s.sample_seed = job.training.seed;
  s.train = job.data.train_source();
  s.validation = job.data.validation_source();
  s.eval_windows = job.eval.windows;
  s.optimizer = job.optimizer;
  s.overlap_gradient_reduce = job.training.overlap_gradient_reduce;
  s.device = job.cluster.device;
  s.shared_memory = job.cluster.shared_memory;
  s.spin_wait_us = job.cluster.spin_wait_us;
  // Twice the coordinator's forming deadline: the coordinator, which can name the node that holds
  // the epoch up, gives up first.
  s.connect_timeout_ms = static_cast<std::int32_t>(2 * job.faults.form_deadline_ms);
  return s;
}

}  // namespace oobleck::apps
