#include "apps/profile_command.hpp"

#include <cstdio>
#include <optional>

#include "apps/cli_args.hpp"
#include "apps/job_file.hpp"
#include "messages/profile_file.hpp"
#include "messages/input_error.hpp"
#include "messages/profile_json.hpp"
#include "runtime/profiler.hpp"

namespace oobleck::apps {

namespace {

constexpr const char* kUsage = R"(usage: oobleck-profile [--config JOB.toml] [--out PATH] [--json] [--repeats N]

Measures every layer of the job's model on this machine's CPU (one intra-op thread): forward and
backward separately (median of N runs after warm-up), parameter bytes, and the activation bytes
autograd retains per microbatch. Writes the planning profile, which records the model's config
hash, the microbatch size and the device kind, so oobleck-plan refuses it for another job.

  --config JOB.toml  job file ([model], [training] microbatch, [cluster] device_memory_bytes,
                     [profile] warmup/repeats); without it the default model is profiled
  --out PATH         write the profile there (Cap'n Proto; JSON when PATH ends in .json);
                     default profile.capnp unless --json is given
  --json             print the profile as JSON on stdout (the form oobleck-plan --profile reads)
  --repeats N        timed runs per layer (overrides the job file)
  --help             this text
)";

}  // namespace

int run_profile_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    cli_args a(args);
    if (a.wants_help()) {
      out << kUsage;
      return 0;
    }
    std::string config, out_path;
    bool json = false;
    std::optional<int> repeats;
    while (a.more()) {
      const std::string flag = a.flag();
      if (flag == "--config") config = a.value(flag);
      else if (flag == "--out") out_path = a.value(flag);
      else if (flag == "--json") json = true;
      else if (flag == "--repeats") repeats = a.integer(flag, 1, 1000);
      else throw planning::planning_error("unknown option " + flag + " (see --help)");
    }
    const job_file job = config.empty() ? job_file{} : read_job_file(config);
    if (out_path.empty() && !json) out_path = "profile.capnp";
    runtime::profiler_options options{.microbatch = job.microbatch,
                                      .warmup = job.profile_warmup,
                                      .repeats = repeats.value_or(job.profile_repeats),
                                      .device_memory_bytes = job.device_memory_bytes};
    err << "profiling " << job.model.num_layers() << " layers (config " << job.model.hash() << ", microbatch "
        << options.microbatch << ", " << options.repeats << " repeats)...\n";
    const auto layers = runtime::measure_layers(job.model, options);
    char line[160];
    std::snprintf(line, sizeof line, "%-10s %12s %12s %14s %16s\n", "layer", "forward ms", "backward ms", "param bytes",
                  "activation bytes");
    err << line;
    for (const auto& m : layers) {
      std::snprintf(line, sizeof line, "%-10s %12.4f %12.4f %14lld %16lld\n", m.name.c_str(), m.forward_ms,
                    m.backward_ms, static_cast<long long>(m.param_bytes), static_cast<long long>(m.activation_bytes));
      err << line;
    }
    const auto profile = runtime::make_profile(job.model, options, layers);
    if (!out_path.empty()) {
      if (out_path.size() > 5 && out_path.substr(out_path.size() - 5) == ".json") messages::write_profile_json(profile, out_path);
      else messages::write_profile_capnp(profile, out_path);
      err << "profile written to " << out_path << "\n";
    }
    if (json) out << messages::profile_json_text(profile, 2) << "\n";
    return 0;
  } catch (const planning::planning_error& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  } catch (const messages::input_error& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace oobleck::apps
