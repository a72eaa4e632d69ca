#include "apps/checkpoint_job.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/checkpoint_model.hpp"
#include "runtime/checkpoint.hpp"

namespace oobleck::apps {

namespace fs = std::filesystem;

namespace {

std::string exact(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

std::string shell_quoted(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The training data as the trajectory sees it: the generated corpus by its size and seed (the
/// text of every checkpoint written before data files existed); a file by its kind, name, dtype and
/// size, not its folder, so a job resumed from a checkpoint may find the same file elsewhere.
std::string data_identity(const runtime::data_source& s) {
  if (s.kind == runtime::data_source::kind_t::generated)
    return std::to_string(s.corpus_bytes) + " " + std::to_string(s.corpus_seed);
  std::error_code ec;
  const auto bytes = fs::file_size(s.path, ec);
  const std::string name = fs::path(s.path).filename().string();
  return (s.kind == runtime::data_source::kind_t::text ? "text " : "tokens " + runtime::dtype_name(s.dtype) + " ") +
         std::to_string(name.size()) + ":" + name + " " + (ec ? std::string("unreadable") : std::to_string(bytes));
}

}  // namespace

std::string trajectory_hash(const job_file& job) {
  std::ostringstream s;
  s << "oobleck-trajectory-1\n"
    << "model " << job.model.hash() << "\n"
    << "data " << data_identity(job.data.train_source()) << "\n"
    << "training " << job.training.steps << " " << job.training.global_batch << " " << job.training.microbatch << " "
    << job.training.seed << "\n";
  const auto& o = job.optimizer;
  s << "optimizer " << exact(o.beta1) << " " << exact(o.beta2) << " " << exact(o.eps) << " " << exact(o.weight_decay)
    << " " << exact(o.lr.peak) << " " << o.lr.warmup_steps << " " << o.lr.total_steps << " " << exact(o.lr.min_lr) << " "
    << runtime::lr_decay_name(o.lr.decay) << "\n";
  // Clipping changes the trajectory; written only when on, so checkpoints of jobs that never
  // clipped (all those written before the key existed) keep their hash.
  if (o.clip_norm > 0) s << "clip_norm " << exact(o.clip_norm) << "\n";
  const auto text = s.str();
  return runtime::sha256_hex({reinterpret_cast<const std::byte*>(text.data()), text.size()});
}

actors::checkpoint_deps checkpoint_deps_for(const job_file& job, const std::string& root, std::uint64_t every) {
  actors::checkpoint_deps d;
  if (root.empty()) return d;
  d.root = fs::absolute(root).lexically_normal().string();
  d.every = every;
  d.off_thread = true;  // hashing and fsync of a large checkpoint must not stall the coordinator
  const std::string hash = trajectory_hash(job);
  const auto model_seed = job.model.seed;
  const auto sample_seed = job.training.seed;
  const auto layers = job.model.num_layers();
  const std::string model_toml = checkpoint_model_toml(job.model);
  const std::string r = d.root;
  d.begin = [r](std::uint64_t step) { return runtime::begin_checkpoint(r, step).string(); };
  d.finish = [=](const std::string& temp, std::uint64_t step, const std::vector<messages::checkpoint_layer_file>& files) {
    runtime::checkpoint_manifest m;
    m.job_hash = hash;
    m.step = step;
    m.model_seed = model_seed;
    m.sample_seed = sample_seed;
    m.num_layers = layers;
    for (const auto& f : files)
      m.files.push_back({f.layer.value, runtime::layer_file_name(f.layer.value), f.bytes, f.sha256});
    const auto final_dir = runtime::finish_checkpoint(temp, m);
    // Beside the manifest (which lists only layer files), so that oobleck-export and oobleck-eval
    // need nothing but the checkpoint. Written to a temporary name and renamed, like the rest.
    const auto model_file = final_dir / checkpoint_model_file;
    const auto temp_file = final_dir / (std::string(checkpoint_model_file) + ".tmp");
    {
      std::ofstream out(temp_file, std::ios::trunc);
      out << model_toml;
      if (!out.flush()) throw runtime::checkpoint_error(temp_file.string() + ": cannot write it");
    }
    std::error_code ec;
    fs::rename(temp_file, model_file, ec);
    if (ec) throw runtime::checkpoint_error(model_file.string() + ": cannot rename it into place: " + ec.message());
    return final_dir.string();
  };
  d.discard = [](const std::string& temp) {
    std::error_code ec;
    fs::remove_all(temp, ec);
  };
  d.latest = [r] {
    const auto all = runtime::list_checkpoints(r);
    return all.empty() ? std::string() : all.back().string();
  };
  return d;
}

std::string resume_from(actors::checkpoint_deps& deps, const job_file& job, const std::string& dir) {
  const auto hash = trajectory_hash(job);
  const int layers = job.model.num_layers();
  std::error_code ec;
  const bool is_checkpoint = fs::exists(fs::path(dir) / runtime::checkpoint_manifest_name, ec);
  const auto found = is_checkpoint ? std::vector<fs::path>{} : runtime::list_checkpoints(dir);
  if (found.empty()) {  // a checkpoint, or nothing that holds one: read_checkpoint says what is wrong
    const auto m = runtime::read_checkpoint(dir, hash, layers);
    deps.resume_dir = fs::absolute(dir).lexically_normal().string();
    deps.resume_step = m.step;
    return {};
  }
  // The folder of a job's checkpoints: the newest one that is complete and valid for this job.
  std::string refused;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      const auto m = runtime::read_checkpoint(*it, hash, layers);
      deps.resume_dir = fs::absolute(*it).lexically_normal().string();
      deps.resume_step = m.step;
      return "the newest complete checkpoint in " + dir + " is " + deps.resume_dir +
             (refused.empty() ? std::string() : " (refused:" + refused + ")");
    } catch (const runtime::checkpoint_error& e) {
      refused += " " + it->filename().string() + ": " + e.what() + ";";
    }
  }
  throw runtime::checkpoint_error(dir + ": none of its " + std::to_string(found.size()) +
                                  " checkpoint(s) is valid for this job:" + refused);
}

std::string resume_command_line(const std::string& program, const std::vector<std::string>& args, const std::string& dir) {
  std::string out = program;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--resume") {
      ++i;
      continue;
    }
    if (args[i].rfind("--resume=", 0) == 0) continue;
    out += " " + shell_quoted(args[i]);
  }
  return out + " --resume " + shell_quoted(dir);
}

std::string local_resume_prefix(const std::vector<std::string>& args) {
  auto injection = [](const std::string& a) {
    for (const char* flag : {"--fail-at", "--hang-at", "--join-at"})
      if (a == flag || a.rfind(std::string(flag) + "=", 0) == 0) return true;
    return false;
  };
  std::string out = "oobleck-local";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (injection(a) || a == "--resume" || a.rfind("--resume=", 0) == 0) {
      if (a.find('=') == std::string::npos) ++i;  // and its value
      continue;
    }
    if ((a == "--config" || a == "--checkpoint-dir") && i + 1 < args.size()) {
      out += " " + a + " " + shell_quoted(fs::absolute(args[++i]).string());
      continue;
    }
    out += " " + shell_quoted(a);
  }
  return out;
}

}  // namespace oobleck::apps
