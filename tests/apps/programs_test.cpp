// The programs as a user meets them: every failure is one "error: ..." line and exit status 2 for
// bad input or 1 for an internal failure, never std::terminate; --help exits 0.
#include "apps/program_main.hpp"

#include <doctest/doctest.h>

#include <CLI/Error.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "messages/input_error.hpp"
#include "planning/profile.hpp"
#include "runtime/child_process.hpp"
#include "support/example_profile.hpp"
#include "support/subprocess.hpp"

using oobleck::apps::exit_status_of;
using oobleck::testing::run_process;

namespace {

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

/// One "error: " line on stderr that says `expected`, nothing on stdout.
void check_one_error(const oobleck::testing::process_result& r, int status, const std::string& expected) {
  CAPTURE(r.err);
  CHECK(r.exit_status == status);
  CHECK(r.out.empty());
  CHECK(r.err.rfind("error: ", 0) == 0);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find(expected) != std::string::npos);
}

struct temp_file {
  std::string path;
  temp_file(const std::string& name, const std::string& text)
      : path("/tmp/oobleck-" + std::to_string(::getpid()) + "-" + name) {
    std::ofstream(path) << text;
  }
  ~temp_file() { std::remove(path.c_str()); }
};

struct caught {
  int status;
  std::string err;
};

template <class F>
caught status_of(F throw_it) {
  std::ostringstream err;
  const int status = exit_status_of(err, [&]() -> int {
    throw_it();
    return 0;
  });
  return {status, err.str()};
}

}  // namespace

TEST_CASE("the program root turns every exception into one line and a status") {
  CHECK(status_of([] {}).status == 0);
  CHECK(status_of([] {}).err.empty());
  const auto input = status_of([] { throw oobleck::messages::input_error("job.toml:3: unknown key model.x"); });
  CHECK(input.status == 2);
  CHECK(input.err == "error: job.toml:3: unknown key model.x\n");
  CHECK(status_of([] { throw oobleck::planning::planning_error("f"); }).status == 2);
  // Something the program needs was not there: said as it is, exit 1, not an internal failure.
  const auto away =
      status_of([] { throw oobleck::apps::unavailable("cannot reach the coordinator at h:1 within 2 s"); });
  CHECK(away.status == 1);
  CHECK(away.err == "error: cannot reach the coordinator at h:1 within 2 s\n");
  CHECK(status_of([] { throw std::invalid_argument("invalid model config"); }).status == 2);
  CHECK(status_of([] { throw CLI::RequiredError("--profile"); }).status == 2);
  // LibTorch's c10::Error is a std::exception whose what() goes on with a backtrace.
  const auto internal = status_of([] { throw std::runtime_error("out of memory\nException raised from alloc_cpu"); });
  CHECK(internal.status == 1);
  CHECK(internal.err == "error: internal: out of memory\n");
  const auto unknown = status_of([] { throw 42; });
  CHECK(unknown.status == 1);
  CHECK(unknown.err.rfind("error: internal: ", 0) == 0);
  CHECK(lines(unknown.err) == 1);
}

TEST_CASE("--help prints the usage of every flag and exits 0") {
  const auto plan = run_process(OOBLECK_PLAN_BINARY, {"--help"});
  CHECK(plan.exit_status == 0);
  CHECK(plan.err.empty());
  for (const char* flag : {"--profile", "--nodes", "--fault-tolerance", "--global-batch", "--microbatch",
                           "--gpus-per-node", "--device-memory", "--state-factor", "--template-nodes", "--fail",
                           "--join", "--json"})
    CHECK(plan.out.find(flag) != std::string::npos);
  const auto profile = run_process(OOBLECK_PROFILE_BINARY, {"-h"});
  CHECK(profile.exit_status == 0);
  CHECK(profile.err.empty());
  for (const char* flag : {"--config", "--out", "--json", "--repeats"}) CHECK(profile.out.find(flag) != std::string::npos);
}

TEST_CASE("--help names what each flag's value is, and a bare PATH only where the text explains it") {
  struct program_help {
    std::string program;
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> labels;  // flag, the name of its value
  };
  const std::vector<program_help> programs{
      {"oobleck-coordinator",
       {"--help"},
       {{"--listen", "HOST:PORT"},
        {"--config", "JOB.toml"},
        {"--token-file", "FILE"},
        {"--metrics-out", "FILE"},
        {"--events-out", "FILE"},
        {"--address-file", "FILE"},
        {"--http", "HOST:PORT"},
        {"--checkpoint-dir", "DIR"},
        {"--resume", "DIR"},
        {"--resume-command", "COMMAND"},
        {"--profile", "FILE"},
        {"--profile-cache", "DIR"}}},
      {"oobleck-worker",
       {"--help"},
       {{"--coordinator", "HOST:PORT[,HOST:PORT]"},
        {"--token-file", "FILE"},
        {"--name", "NAME"},
        {"--config", "JOB.toml"},
        {"--data-host", "HOST"}}},
      {"oobleck-ctl", {"--help"}, {{"--coordinator", "HOST:PORT[,HOST:PORT]"}, {"--token-file", "FILE"}}},
      {"oobleck-ctl", {"shutdown", "--help"}, {{"--reason", "TEXT"}}},
      {"oobleck-local",
       {"--help"},
       {{"--config", "JOB.toml"},
        {"--metrics-out", "FILE"},
        {"--events-out", "FILE"},
        {"--trace", "FILE"},
        {"--profile", "FILE"},
        {"--checkpoint-dir", "DIR"},
        {"--resume", "DIR"}}},
      {"oobleck-plan", {"--help"}, {{"--profile", "FILE"}}},
      {"oobleck-profile", {"--help"}, {{"--config", "JOB.toml"}, {"--out", "PATH"}}},
      {"oobleck-sim",
       {"--help"},
       {{"--profile", "FILE"}, {"--trace", "FILE"}, {"--bamboo-profile", "FILE"}, {"--recovery-costs", "FILE"}}},
  };
  for (const auto& p : programs) {
    CAPTURE(p.program);
    const auto r = run_process(std::string(OOBLECK_APPS_DIR) + "/" + p.program, p.args);
    REQUIRE(r.exit_status == 0);
    std::map<std::string, std::string> label;  // flag -> the word after it on its help line
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string flag, value;
      if (!(words >> flag >> value) || flag.rfind("-", 0) != 0) continue;
      flag = flag.substr(flag.rfind(',') + 1);  // "-h,--help" -> "--help"
      label[flag] = value;
      CAPTURE(line);
      if (value == "PATH") CHECK(line.find("PATH", line.find(" PATH") + 5) != std::string::npos);
    }
    for (const auto& [flag, expected] : p.labels) {
      CAPTURE(flag);
      CHECK(label[flag] == expected);
    }
  }
}

TEST_CASE("oobleck-ctl SUBCOMMAND --help shows that subcommand's own flags") {
  const std::string ctl = std::string(OOBLECK_APPS_DIR) + "/oobleck-ctl";
  const auto kill = run_process(ctl, {"kill-node", "--help"});
  CHECK(kill.exit_status == 0);
  CHECK(kill.out.find("node id (see status)") != std::string::npos);
  CHECK(kill.out.find("Usage: oobleck-ctl [OPTIONS] kill-node [OPTIONS] id") != std::string::npos);
  const auto hang = run_process(ctl, {"--coordinator", "127.0.0.1:1", "hang-node", "-h"});
  CHECK(hang.exit_status == 0);
  CHECK(hang.out.find("--seconds") != std::string::npos);
  CHECK(hang.out.find("oobleck-ctl --coordinator HOST:PORT --token-file FILE hang-node") != std::string::npos);
  const auto error = run_process(ctl, {"error-node", "--help"});
  CHECK(error.out.find("--attempts") != std::string::npos);
  const auto shutdown = run_process(ctl, {"shutdown", "--help"});
  CHECK(shutdown.out.find("--checkpoint") != std::string::npos);
  const auto status = run_process(ctl, {"status", "--help"});
  CHECK(status.out.find("--json") != std::string::npos);
  const auto none = run_process(ctl, {"--coordinator", "127.0.0.1:1", "--token-file", "t"});
  CHECK(none.exit_status == 2);
  CHECK(none.err ==
        "error: a subcommand is required: status, kill-node, hang-node, error-node, shutdown (see --help)\n");
  const auto top = run_process(ctl, {"--help"});  // the program's: its own flags and the subcommands
  CHECK(top.out.find("--token-file") != std::string::npos);
  CHECK(top.out.find("kill-node") != std::string::npos);
}

TEST_CASE("a token file that cannot be used is bad input: one error line, exit 2, not an internal error") {
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-token-input-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string open_to_all = (dir / "open").string();
  std::ofstream(open_to_all) << std::string(64, 'a') << "\n";
  std::filesystem::permissions(open_to_all, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                                                std::filesystem::perms::group_read |
                                                std::filesystem::perms::others_read);
  const std::string missing = (dir / "missing").string();
  const std::string bin_dir = OOBLECK_APPS_DIR;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{bin_dir + "/oobleck-ctl", "--coordinator", "127.0.0.1:1", "--token-file", missing, "status"},
       "token file " + missing + ": No such file or directory"},
      {{bin_dir + "/oobleck-ctl", "--coordinator", "127.0.0.1:1", "--token-file", open_to_all, "status"},
       "run chmod 600 " + open_to_all},
      {{bin_dir + "/oobleck-worker", "--coordinator", "127.0.0.1:1", "--token-file", missing},
       "token file " + missing + ": No such file or directory"},
      {{bin_dir + "/oobleck-coordinator", "--listen", "127.0.0.1:0", "--config",
        std::string(OOBLECK_SOURCE_DIR) + "/examples/jobs/default.toml", "--token-file", open_to_all},
       "run chmod 600 " + open_to_all},
      {{bin_dir + "/oobleck-coordinator", "--listen", "127.0.0.1:0", "--config",
        std::string(OOBLECK_SOURCE_DIR) + "/examples/jobs/default.toml", "--token-file",
        (dir / "no-such-folder" / "token").string()},
       "cannot create token file " + (dir / "no-such-folder" / "token").string()},
  };
  for (const auto& [command, expected] : cases) {
    CAPTURE(command[0]);
    const std::vector<std::string> args(command.begin() + 1, command.end());
    const auto r = run_process(command[0], args);
    CAPTURE(r.err);
    CHECK(r.exit_status == 2);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(r.err.find("internal") == std::string::npos);
    CHECK(lines(r.err) == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("oobleck-coordinator: a checkpoint directory it cannot create or write into is refused at start") {
  // It used to be accepted, and every checkpoint of the job then failed ("training goes on").
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-checkpoint-dir-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string token = (dir / "token").string(), file = (dir / "a-file").string();
  std::ofstream(file) << "not a directory\n";
  const std::string job = std::string(OOBLECK_SOURCE_DIR) + "/examples/jobs/default.toml";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"/proc/oobleck-no-such-dir",
       "--checkpoint-dir /proc/oobleck-no-such-dir: cannot create the checkpoint directory"},
      {file + "/sub", "--checkpoint-dir " + file + "/sub: cannot create the checkpoint directory"},
      {file, "--checkpoint-dir " + file + ": cannot create the checkpoint directory: Not a directory"},
  };
  for (const auto& [checkpoint_dir, expected] : cases) {
    const auto r = run_process(std::string(OOBLECK_APPS_DIR) + "/oobleck-coordinator",
                               {"--listen", "127.0.0.1:0", "--config", job, "--token-file", token, "--steps", "0",
                                "--checkpoint-dir", checkpoint_dir});
    CAPTURE(r.err);
    CHECK(r.exit_status == 2);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(lines(r.err) == 1);
  }
  // One it can create is made at start.
  const auto made = dir / "made" / "here";
  oobleck::runtime::child_process coordinator(
      std::string(OOBLECK_APPS_DIR) + "/oobleck-coordinator",
      {"--listen", "127.0.0.1:0", "--config", job, "--token-file", token, "--steps", "0", "--checkpoint-dir",
       made.string()},
      {.out = oobleck::runtime::child_output::file((dir / "coordinator.log").string())});
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::is_directory(made) && std::chrono::steady_clock::now() < by)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(std::filesystem::is_directory(made));
  coordinator.kill_and_reap();
  std::filesystem::remove_all(dir);
}

TEST_CASE("oobleck-plan: bad flags are one error line and exit 2") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--profile", kProfile, "--template-nodes", "two"}, "--template-nodes expects an integer, got 'two'"},
      {{"--profile", kProfile, "--template-nodes", "0x2"}, "--template-nodes expects an integer"},
      {{"--profile", kProfile, "--template-nodes", "4294967298"}, "--template-nodes must be <= 65536"},
      {{"--profile", kProfile, "--template-nodes", "2", "--state-factor", "nan"}, "--state-factor expects a finite"},
      {{"--profile", kProfile, "--template-nodes", "2", "--state-factor", "0"}, "--state-factor must be >= 1e-09, got 0"},
      {{"--profile", kProfile, "--template-nodes"}, "--template-nodes"},
      {{"--profile", kProfile, "--template-nodes", "2", "--bogus"}, "unknown option --bogus"},
      {{"--template-nodes", "2"}, "--profile is required"},
      {{"--profile", "/nonexistent/profile.json", "--template-nodes", "2"}, "cannot read profile"},
  };
  for (const auto& [args, expected] : cases) {
    CAPTURE(expected);
    check_one_error(run_process(OOBLECK_PLAN_BINARY, args), 2, expected);
  }
}

TEST_CASE("oobleck-profile: bad flags and job files are refused before LibTorch runs") {
  const temp_file small_vocab("small-vocab.toml", "[model]\nvocab = 100\n");
  const temp_file typo("typo.toml", "[model]\nblocks = 2\n[trainig]\nmicrobatch = 2\n");
  const temp_file narrowing("narrowing.toml", "[training]\nmicrobatch = 4294967297\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--repeats", "many"}, "--repeats expects an integer, got 'many'"},
      {{"--repeats", "0"}, "--repeats must be >= 1, got 0"},
      {{"--repeats", "99999999999999999999"}, "--repeats must be <= 1000"},
      {{"--json", "extra"}, "unexpected argument 'extra'"},
      {{"--config", small_vocab.path, "--json"}, small_vocab.path + ":2: model.vocab must be >= 256"},
      {{"--config", typo.path, "--json"}, typo.path + ":4: unknown key trainig.microbatch"},
      {{"--config", narrowing.path, "--json"}, narrowing.path + ":2: training.microbatch must be <= 2147483647"},
      {{"--config", "/nonexistent/job.toml", "--json"}, "cannot read job file /nonexistent/job.toml"},
      {{"--config", "/tmp", "--json"}, "cannot read job file /tmp"},
      {{"--out", "/nonexistent/folder/profile.capnp"}, "--out: /nonexistent/folder is not a directory"},
      {{"--out", "/tmp"}, "--out: /tmp is a directory"},
  };
  for (const auto& [args, expected] : cases) {
    CAPTURE(expected);
    check_one_error(run_process(OOBLECK_PROFILE_BINARY, args), 2, expected);  // no "profiling ..." line
  }
}

TEST_CASE("oobleck-profile writes to the job's profile.file, relative to the job file, when --out is not given") {
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-profile-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string job = (dir / "job.toml").string();
  std::ofstream(job) << "[model]\nblocks = 1\nd_model = 16\nseq_len = 8\n[training]\nmicrobatch = 2\nglobal_batch = 2\n"
                        "[profile]\nwarmup = 0\nrepeats = 1\nfile = \"out/measured.json\"\n";
  // The folder is checked before LibTorch runs, and the error says where the path came from.
  check_one_error(run_process(OOBLECK_PROFILE_BINARY, {"--config", job}), 2,
                  job + ": profile.file: " + (dir / "out").string() + " is not a directory");
  std::filesystem::create_directories(dir / "out");
  const auto r = run_process(OOBLECK_PROFILE_BINARY, {"--config", job});
  CAPTURE(r.err);
  CHECK(r.exit_status == 0);
  std::ifstream written(dir / "out/measured.json");
  REQUIRE(written);
  CHECK(written.peek() == '{');  // JSON, as the name says
  std::filesystem::remove_all(dir);
}

TEST_CASE("oobleck-profile: a LibTorch failure is one internal error line and exit 1") {
  // 2^50 features: the token embedding alone is 2^60 bytes, beyond any address space, so
  // LibTorch's allocator throws c10::Error at once (no overcommit setting can grant it).
  const temp_file huge("huge.toml", "[model]\nd_model = 1125899906842624\nblocks = 1\n");
  const auto r = run_process(OOBLECK_PROFILE_BINARY, {"--config", huge.path, "--json"});
  CAPTURE(r.err);
  CHECK(r.exit_status == 1);
  CHECK(r.out.empty());
  const auto at = r.err.find("error: internal: ");
  REQUIRE(at != std::string::npos);
  CHECK(r.err.find('\n', at) == r.err.size() - 1);  // the error is the last line, and one line
}
