#include "bench/cluster_programs.hpp"

#include <dlfcn.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "runtime/child_process.hpp"

namespace oobleck::bench {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string allocator_in_use() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&std::malloc), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  return path.substr(path.find_last_of('/') + 1);
}

std::string program_run::transcript() const {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

program_run run_program(const std::string& path, const std::vector<std::string>& args, double timeout_s) {
  runtime::output_pipe output;
  runtime::child_process child(path, args, {.out = runtime::child_output::descriptor(output.write_end())});
  output.close_write_end();
  program_run r;
  auto keep = [&](const std::string& line) { r.lines.push_back(line); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(timeout_s));
  if (!output.read_lines_until(deadline, keep)) {
    child.signal(SIGTERM);  // oobleck-local stops everything it started
    output.read_lines(keep);
  }
  r.status = child.wait();
  return r;
}

std::string default_job_text(const std::string& bin) {
  const auto r = run_program(bin + "/oobleck-local", {"--print-default-job"}, 60);
  if (r.status != 0) throw std::runtime_error("oobleck-local --print-default-job failed:\n" + r.transcript());
  return r.transcript();
}

metrics_records read_metrics(const std::filesystem::path& path) {
  metrics_records m;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    if (l.empty()) continue;
    auto j = nlohmann::json::parse(l);
    (j.contains("event") ? m.events : m.steps).push_back(std::move(j));
  }
  return m;
}

}  // namespace oobleck::bench
