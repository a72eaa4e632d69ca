#include "apps/coordinator_profile.hpp"

#include <exception>
#include <filesystem>
#include <optional>

#include "messages/profile_file.hpp"
#include "messages/profile_json.hpp"
#include "planning/profile.hpp"
#include "runtime/device_spec.hpp"

namespace oobleck::apps {

namespace {

/// What a profile must have been measured for to plan this job.
planning::profile_expectation expected_of(const job_file& job) {
  return {.microbatch_size = job.training.microbatch,
          .gpus_per_node = job.cluster.slots_per_node,
          .config_hash = job.model.hash(),
          .device_kind = std::nullopt};
}

/// The file a profile measured at job start is kept in, in `folder`: one per model config,
/// microbatch, slots per node, device kind and precision (the job's cluster.device and
/// training.precision: a CPU profile is never read back for a job on GPUs, nor an fp32 one for bf16).
std::string profile_cache_file(const std::string& folder, const job_file& job) {
  return (std::filesystem::path(folder) /
          ("profile-" + job.model.hash() + "-mb" + std::to_string(job.training.microbatch) + "-slots" +
           std::to_string(job.cluster.slots_per_node) + "-" + job.cluster.device +
           (job.model.precision == runtime::precision_kind::fp32 ? std::string()
                                                                 : "-" + runtime::precision_name(job.model.precision)) +
           ".json"))
      .string();
}

}  // namespace

/// The profile the job is planned from (ARCHITECTURE.md §4 "Profile at job start"): --profile,
/// else [profile] file, else one this job measured at an earlier start (its cache file); none of
/// these: measured on one of its nodes once they are admitted (deps.profile_at_start). A profile
/// of another job is refused (a given one), or measured again (a cached one).
void choose_profile(actors::coordinator_deps& deps, const job_file& job, const std::string& given,
                    const std::string& cache_folder, const std::function<void(const std::string&)>& log) {
  const std::string file = !given.empty() ? given : job.profile.file;
  if (!file.empty()) {
    deps.profile = messages::read_profile_file(file);
    planning::check_matches(deps.profile, expected_of(job));
    log("planning from the profile " + file);
    return;
  }
  const std::string cached = cache_folder.empty() ? std::string() : profile_cache_file(cache_folder, job);
  if (!cached.empty() && std::filesystem::exists(cached)) {
    try {
      deps.profile = messages::read_profile_file(cached);
      planning::check_matches(deps.profile, expected_of(job));
      log("planning from the profile this job measured at an earlier start: " + cached);
      return;
    } catch (const std::exception& e) {
      log("not using the cached profile " + cached + " (" + e.what() + "): measuring the model again");
    }
  }
  deps.profile = modelled_profile(job);
  deps.profile_at_start = true;
  deps.accept_profile = [expected = expected_of(job)](const std::string& text) {
    auto p = messages::profile_from_json(text);
    planning::validate(p);
    planning::check_matches(p, expected);
    return p;
  };
  if (cached.empty()) return;
  deps.on_profiled = [cached, log](const planning::profile& p) {
    // Kept for the job's next start (a replacement coordinator, a resume): written whole, then
    // renamed, so a reader never meets half a file.
    try {
      std::filesystem::create_directories(std::filesystem::path(cached).parent_path());
      const std::string temp = cached + ".tmp";
      messages::write_profile_json(p, temp);
      std::filesystem::rename(temp, cached);
      log("kept the measured profile in " + cached);
    } catch (const std::exception& e) {
      log("could not keep the measured profile in " + cached + ": " + e.what());
    }
  };
}

}  // namespace oobleck::apps
