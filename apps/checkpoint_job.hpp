#pragma once
// Checkpoints from the programs' side: which job a checkpoint belongs to, the coordinator's file
// operations over runtime/checkpoint, and the exit status of a job stopped by the policy.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "apps/job_file.hpp"

namespace oobleck::apps {

/// oobleck-coordinator's (and oobleck-local's) exit status when the reconfiguration policy said
/// "checkpoint and stop" (too few nodes left, or a layer without a surviving holder), whether or
/// not a checkpoint could be written. 0: finished, 1: internal error, 2: bad input.
inline constexpr int exit_checkpoint_and_stop = 4;

/// The hash of everything that decides a job's trajectory: [model], [data] (the training source:
/// the generated corpus's size and seed, or a file's name, dtype and size), [training] (steps
/// too: the LR schedule ends there) and [optimizer]. A checkpoint resumes only a job with the same
/// hash; [cluster] (node count, f, memory, heartbeats), [checkpoint], [http] and [profile] may
/// change between the run that wrote it and the one that resumes it.
std::string trajectory_hash(const job_file& job);

/// The coordinator's checkpoint functions for checkpoints under `root` (made absolute; empty: no
/// checkpoints) every `every` steps (0: only the fallback).
actors::checkpoint_deps checkpoint_deps_for(const job_file& job, const std::string& root, std::uint64_t every);

/// Validates a checkpoint of `job` in full (runtime::read_checkpoint: throws
/// runtime::checkpoint_error, an input_error, naming the file) and sets deps.resume_dir (absolute)
/// and deps.resume_step from it. `dir` is either a checkpoint (a step-N folder) or the folder of
/// checkpoints a job writes (its --checkpoint-dir): then the newest complete checkpoint in it that
/// is valid for the job is taken, and the returned line says which (and which newer ones were
/// refused, and why); for a checkpoint itself the line is empty.
std::string resume_from(actors::checkpoint_deps& deps, const job_file& job, const std::string& dir);

/// `args` as one shell command line after `program`, with every `--resume X` removed and
/// `--resume dir` appended: what a stopped job prints to resume it.
std::string resume_command_line(const std::string& program, const std::vector<std::string>& args, const std::string& dir);

/// oobleck-local's own command line to resume a stopped run, without its ' --resume DIR': paths
/// made absolute, the previous --resume and one-time injections (--fail-at, --hang-at,
/// --join-at) left out.
std::string local_resume_prefix(const std::vector<std::string>& args);

}  // namespace oobleck::apps
