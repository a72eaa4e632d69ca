#include "apps/profile_command.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "apps/flags.hpp"
#include "apps/job_file.hpp"
#include "apps/profile_measure.hpp"
#include "apps/program_main.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_file.hpp"
#include "messages/profile_json.hpp"

namespace oobleck::apps {

namespace {

constexpr const char* kAbout = R"(Measures every layer of the job's model on this machine's CPU at every stage width d = 1, 2, ...,
cluster.slots_per_node (d intra-op threads, as the runtime runs a stage of width d): forward and
backward separately (median of N runs after warm-up), parameter bytes, and the activation bytes
autograd retains per microbatch, the bytes of its output and one AdamW step over its parameters;
then the link between two nodes: by default the host data plane between two transports on
127.0.0.1 (bandwidth, and the latency a stage that blocked for its message sees, the cold start of
the op it then runs included), which is what oobleck-local's nodes use. On a real
cluster give its network's figures (--link-latency-ms, --link-gbytes-per-s); --no-link leaves
communication free. The planner charges a stage for receiving its input from another node and
each step for the gradient all-reduce and the optimizer. Writes the planning profile, which records the model's config
hash, the microbatch size and the device kind, so oobleck-plan refuses it for another job.
The job file ([model], [training] microbatch, [cluster] device_memory_bytes and slots_per_node, [profile]
warmup/repeats/file) is checked before anything runs; without --config the default model is profiled.

Exit status: 0 on success, 2 on bad input (one "error: ..." line), 1 on an internal failure
(LibTorch's, such as running out of memory).)";

struct profile_options {
  std::string config, out_path;
  bool json = false;
  std::optional<int> repeats;
  bool no_link = false;
  double link_latency_ms = -1, link_gbytes_per_s = -1;  // < 0: measure on loopback
  std::string device;  ///< empty: the job's cluster.device
};

/// The flags; false when --help was asked.
bool parse(const std::vector<std::string>& args, std::ostream& out, profile_options& o) {
  CLI::App app{"", "oobleck-profile"};
  app.footer(kAbout);
  add_text(app, "--config", o.config, "job file (TOML)")->type_name("JOB.toml");
  add_text(app, "--out", o.out_path,
           "write the profile there (Cap'n Proto; JSON when PATH ends in .json); without --json the default is the "
           "job's profile.file, else profile.capnp");
  app.add_flag("--json", o.json, "print the profile as JSON on stdout (the form oobleck-plan --profile reads)");
  add_integer(app, "--repeats", o.repeats, 1, 1000, "timed microbatches through every layer (overrides the job file)")->type_name("N");
  auto* no_link = app.add_flag("--no-link", o.no_link, "leave communication between nodes free (no link in the profile)");
  auto* latency = add_number(app, "--link-latency-ms", o.link_latency_ms, 0,
                             "latency of one message between two nodes, instead of measuring loopback");
  auto* bandwidth = add_number(app, "--link-gbytes-per-s", o.link_gbytes_per_s, 0,
                               "bandwidth between two nodes in GB/s (0: bytes are free), instead of measuring loopback");
  add_text(app, "--device", o.device,
           "where the layers run: cpu, cuda or cuda:N (default: the job's cluster.device; cuda needs a build with "
           "OOBLECK_WITH_CUDA)")
      ->type_name("cpu|cuda[:N]");
  latency->needs(bandwidth);
  bandwidth->needs(latency);
  no_link->excludes(latency)->excludes(bandwidth);
  return parse_flags(app, args, out);
}

/// Refuses an output path that could not be written now, not after the measurements: its folder
/// missing or not writable, or the path a directory. `from` says where the path came from (--out,
/// or the job's profile.file).
void check_writable_folder(const std::string& path, const std::string& from) {
  const auto folder = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
    throw messages::input_error(from + ": " + folder.string() + " is not a directory");
  const std::string where = folder.empty() ? "." : folder.string();
  if (::access(where.c_str(), W_OK | X_OK) != 0)
    throw messages::input_error(from + ": cannot write into " + where + ": " + std::strerror(errno));
  if (std::filesystem::is_directory(path, ec)) throw messages::input_error(from + ": " + path + " is a directory");
}

}  // namespace

int run_profile_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return exit_status_of(err, [&] {
    profile_options o;
    if (!parse(args, out, o)) return 0;
    const job_file job = o.config.empty() ? job_file{} : read_job_file(o.config);
    std::string out_path = o.out_path;
    if (out_path.empty() && !o.json) out_path = job.profile.file.empty() ? "profile.capnp" : job.profile.file;
    if (!out_path.empty())
      check_writable_folder(out_path, o.out_path.empty() && !job.profile.file.empty() ? o.config + ": profile.file"
                                                                                      : "--out");
    const link_choice link{.none = o.no_link, .latency_ms = o.link_latency_ms, .gbytes_per_s = o.link_gbytes_per_s};
    std::optional<runtime::device_spec> device;
    if (!o.device.empty()) device = parse_device_flag(o.device);
    else check_device_built(job);
    const auto profile = measure_job_profile(job, o.repeats.value_or(job.profile.repeats), link, &err, device);
    if (!out_path.empty()) {
      if (out_path.size() > 5 && out_path.substr(out_path.size() - 5) == ".json") messages::write_profile_json(profile, out_path);
      else messages::write_profile_capnp(profile, out_path);
      err << "profile written to " << out_path << "\n";
    }
    if (o.json) out << messages::profile_json_text(profile, 2) << "\n";
    return 0;
  });
}

}  // namespace oobleck::apps
