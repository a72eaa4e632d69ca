#pragma once
// Which profile oobleck-coordinator plans a job from (ARCHITECTURE.md §4 "Profile at job start"):
// a given file, one this job measured at an earlier start, or one measured on its nodes once they
// are admitted, then kept for the next start. No LibTorch.

#include <functional>
#include <string>

#include "actors/coordinator.hpp"
#include "apps/job_file.hpp"

namespace oobleck::apps {

/// Sets deps.profile from `given` (--profile), else the job's [profile] file, else the cache file
/// in `cache_folder` (empty: no cache) when it matches the job; none of these: a modelled profile
/// until one of the job's nodes has measured it (deps.profile_at_start), kept then in the cache
/// folder. A given profile of another job is refused (planning::planning_error); a cached one is
/// measured again, saying why through `log`.
void choose_profile(actors::coordinator_deps& deps, const job_file& job, const std::string& given,
                    const std::string& cache_folder, const std::function<void(const std::string&)>& log);

}  // namespace oobleck::apps
