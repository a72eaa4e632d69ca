#include "apps/plan_command.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "messages/profile_file.hpp"
#include "planning/synthetic_profile.hpp"
#include "support/example_profile.hpp"

using oobleck::apps::run_plan_command;
using nlohmann::json;

namespace {

struct result {
  int code;
  std::string out, err;
};

result plan(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = run_plan_command(args, out, err);
  return {code, out.str(), err.str()};
}

std::vector<std::string> job(std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1",
                                "--global-batch", "256", "--microbatch", "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("--json prints the documented object") {
  const auto r = plan(job({"--json", "--fail", "2", "--join", "2"}));
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  CHECK(v.at("n0") == 2);
  CHECK(v.at("n_max") == 6);
  CHECK(v.at("covered_node_counts").size() == 5);
  const auto& templates = v.at("templates");
  REQUIRE(templates.size() == 5);
  const auto& stage = templates[0].at("stages")[0];
  CHECK(stage.at("node").is_number_integer());
  CHECK(stage.at("gpus").is_number_integer());
  CHECK(stage.at("layers").size() == 2);
  CHECK(templates[0].at("iteration_ms").is_number());
  const auto& inst = v.at("instantiation");
  int microbatches = 0, nodes = 0;
  for (const auto& p : inst.at("pipelines")) {
    microbatches += p.at("microbatches").get<int>();
    nodes += static_cast<int>(p.at("nodes").size());
    CHECK(p.at("time_ms").get<double>() <= inst.at("step_ms").get<double>());
    CHECK(p.at("template_nodes").is_number_integer());
  }
  CHECK(microbatches == 64);
  CHECK(nodes == 8);
  const auto& events = v.at("events");
  REQUIRE(events.size() == 2);
  CHECK(events[0].at("lost")[0] == 2);
  CHECK(events[0].at("action") == "continue");
  CHECK(events[1].at("joined").size() == 2);
  CHECK(events[1].at("joined")[0] == 8);  // next unused id
  const auto& copy = events[1].at("copies").at(0);
  for (const char* key : {"layer", "from_node", "to_node", "bytes"}) CHECK(copy.contains(key));
}

TEST_CASE("--json keeps the documented key order on one line") {
  const auto r = plan(job({"--json", "--fail", "2"}));
  REQUIRE(r.code == 0);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(r.out.rfind(R"({"n0":2,"n_max":6,"covered_node_counts":[4,5,6,7,8],"templates":[{"nodes":2,"iteration_ms":)", 0) == 0);
  std::size_t at = 0;
  for (const char* key : {"\"instantiation\":{\"pipelines\":[{\"nodes\":", "\"template_nodes\":", "\"microbatches\":",
                          "\"time_ms\":", "\"idle_nodes\":", "\"step_ms\":", "\"samples_per_s\":",
                          "\"events\":[{\"lost\":[2],\"joined\":[],\"action\":\"continue\",\"rules\":", "\"pipelines\":",
                          "\"idle_nodes\":", "\"step_ms\":", "\"samples_per_s\":", "\"copies\":"}) {
    const auto next = r.out.find(key, at);
    CAPTURE(key);
    REQUIRE(next != std::string::npos);
    at = next;
  }
}

TEST_CASE("few microbatches per pipeline: no predicted step is shorter than one microbatch's trip") {
  // 4 microbatches over 4 two-node pipelines: one each, fewer than the stages. The paper's closed
  // form predicted less than the forward and backward trip through the stages.
  const auto r = plan({"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1", "--global-batch", "16",
                       "--microbatch", "4", "--json"});
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  std::map<std::int64_t, double> trip;  // template nodes -> sum of stage latencies
  for (const auto& t : v.at("templates")) {
    double sum = 0;
    for (const auto& s : t.at("stages")) sum += s.at("ms").get<double>();
    trip[t.at("nodes").get<std::int64_t>()] = sum;
    CHECK(t.at("makespan_4s_ms").get<double>() >= t.at("iteration_ms").get<double>() * (1 - 1e-12));
  }
  const auto& inst = v.at("instantiation");
  REQUIRE(inst.at("pipelines").size() == 4);
  for (const auto& p : inst.at("pipelines")) {
    CHECK(p.at("microbatches") == 1);
    CHECK(p.at("time_ms").get<double>() >= trip.at(p.at("template_nodes").get<std::int64_t>()) * (1 - 1e-12));
  }
}

TEST_CASE("a join beyond what B/b pipelines can use leaves nodes idle, not an error") {
  // 4 microbatches: at most 4 pipelines of at most 6 nodes, so 4 of the 28 nodes stay idle.
  const auto r = plan({"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1", "--global-batch", "16",
                       "--microbatch", "4", "--join", "20", "--json"});
  CHECK(r.err.empty());
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  const auto& event = v.at("events").at(0);
  CHECK(event.at("action") == "continue");
  CHECK(event.at("pipelines").size() == 4);
  CHECK(event.at("idle_nodes").size() == 4);
}

TEST_CASE("the readable report shows templates, instantiation and events") {
  const auto r = plan(job({"--fail", "2"}));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("n0 = 2, n_max = 6") != std::string::npos);
  CHECK(r.out.find("samples/s") != std::string::npos);
  CHECK(r.out.find("event 1: lost [2] -> continue") != std::string::npos);
  CHECK(r.out.find("link between nodes: free (the profile has no link costs)") != std::string::npos);
}

TEST_CASE("with the profile's link, the report names it and predicts a longer step") {
  auto p = oobleck::messages::read_profile_file(kProfile);
  for (auto& l : p.layers) {
    l.output_bytes = 1 << 20;
    l.optimizer_ms = 1.0;
  }
  p.link = {0.5, 1e6};  // 0.5 ms + 1 ms per MB
  const std::string path = "/tmp/oobleck-plan-link-" + std::to_string(::getpid()) + ".json";
  oobleck::messages::write_profile_json(p, path);
  std::vector<std::string> with = job({"--json"}), without = job({"--json"});
  with[1] = path;
  const auto a = plan(with), b = plan(without);
  std::vector<std::string> text_args = job();
  text_args[1] = path;
  const auto linked_text = plan(text_args).out;
  std::remove(path.c_str());
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(linked_text.find("link between nodes: 0.5 ms per message, 1 GB/s") != std::string::npos);
  const double step_with = json::parse(a.out).at("instantiation").at("step_ms").get<double>();
  const double step_without = json::parse(b.out).at("instantiation").at("step_ms").get<double>();
  CHECK(step_with > step_without);
}

TEST_CASE("events stop at checkpoint_and_stop") {
  const auto r = plan(job({"--json", "--fail", "0,1,2,3,4", "--fail", "5"}));
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  const auto& events = v.at("events");
  REQUIRE(events.size() == 1);
  CHECK(events[0].at("action") == "checkpoint_and_stop");
  CHECK(events[0].at("step_ms").is_null());
}

TEST_CASE("--template-nodes generates one template") {
  const auto r = plan({"--profile", kProfile, "--template-nodes", "3", "--json"});
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  REQUIRE(v.at("templates").size() == 1);
  CHECK(v.at("templates")[0].at("nodes") == 3);
  CHECK(v.at("planning_ms").is_number());
}

TEST_CASE("bad input: one error line and exit code 2") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {job({"--fault-tolerance", "5"}), "needs 6 pipelines"},
      {job({"--global-batch", "250"}), "nearest distributable global batch: 248 or 252"},
      {job({"--global-batch", "4"}), "nearest distributable global batch: 8"},
      {job({"--gpus-per-node", "8"}), "gpus_per_node = 4, the job uses 8"},
      {{"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1", "--global-batch", "256", "--microbatch", "2"},
       "microbatch_size = 4, the job uses 2"},
      {job({"--fail", "9"}), "node 9 is not alive"},
      {job({"--fail", "1,x"}), "comma-separated node ids"},
      {job({"--nodes", "many"}), "--nodes expects an integer"},
      {job({"--bogus"}), "unknown option --bogus"},
      {{"--nodes", "8"}, "--profile is required"},
      {{"--profile", "/nonexistent.json", "--template-nodes", "1"}, "cannot read profile"},
      {{"--profile", kProfile, "--template-nodes", "1", "--device-memory", "1000"}, "no layout of 1 nodes fits"},
      {{"--profile", kProfile, "--template-nodes", "25"}, "the model has 24 layers"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = plan(args);
    CAPTURE(expected);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("--help describes every flag") {
  const auto r = plan({"--help"});
  CHECK(r.code == 0);
  for (const char* flag : {"--profile", "--nodes", "--fault-tolerance", "--global-batch", "--microbatch",
                           "--gpus-per-node", "--device-memory", "--template-nodes", "--fail", "--join", "--json"})
    CHECK(r.out.find(flag) != std::string::npos);
}

struct exit_and_output {
  int status;
  std::string out;
};

// The real binary, so the exit status is main's. timeout(1): pclose() waits for the child, so a
// hung binary would hang the test; it exits 124 instead.
exit_and_output run_plan_binary(const std::string& profile) {
  const std::string cmd =
      "timeout 30 " + std::string(OOBLECK_PLAN_BINARY) + " --profile " + profile + " --template-nodes 1 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 256> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  return {::pclose(pipe), out};
}

TEST_CASE("the oobleck-plan binary exits 2 on a malformed profile") {
  const std::string bad = "/tmp/oobleck-bad-profile-" + std::to_string(::getpid()) + ".json";
  {
    FILE* f = std::fopen(bad.c_str(), "w");
    std::fputs("{\"model\": \"x\", \"layers\": [", f);
    std::fclose(f);
  }
  const auto r = run_plan_binary(bad);
  std::remove(bad.c_str());
  CHECK(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 2);
  CHECK(r.out.find("JSON syntax error") != std::string::npos);
}

TEST_CASE("the oobleck-plan binary refuses a Cap'n Proto profile of 2^30 GPUs per node at once") {
  // It used to pass validation and then loop forever in the planner.
  auto p = oobleck::planning::synthetic_gpt_profile({.layers = 4, .gpus_per_node = 1});
  p.gpus_per_node = 1 << 30;
  const std::string path = "/tmp/oobleck-huge-m-" + std::to_string(::getpid()) + ".capnp";
  oobleck::messages::write_profile_capnp(p, path);
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_plan_binary(path);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  std::remove(path.c_str());
  CHECK(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 2);
  CHECK(elapsed < std::chrono::seconds(5));
  CHECK(r.out == "error: " + path + ": profile.gpus_per_node: 1073741824 is above the limit of 1024 GPUs per node\n");
}
