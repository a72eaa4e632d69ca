#include "apps/plan_command.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <sstream>
#include <sys/wait.h>

#include "planning/json.hpp"

using oobleck::apps::run_plan_command;
namespace json = oobleck::planning::json;

namespace {

const std::string kProfile = std::string(OOBLECK_SOURCE_DIR) + "/examples/profiles/gpt-synthetic-24l.json";

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
  CHECK(v.find("n0")->as_integer() == 2);
  CHECK(v.find("n_max")->as_integer() == 6);
  CHECK(v.find("covered_node_counts")->as_array().size() == 5);
  const auto& templates = v.find("templates")->as_array();
  REQUIRE(templates.size() == 5);
  const auto& stage = templates[0].find("stages")->as_array()[0];
  CHECK(stage.find("node")->is_integer());
  CHECK(stage.find("gpus")->is_integer());
  CHECK(stage.find("layers")->as_array().size() == 2);
  CHECK(templates[0].find("iteration_ms")->is_number());
  const auto* inst = v.find("instantiation");
  int microbatches = 0, nodes = 0;
  for (const auto& p : inst->find("pipelines")->as_array()) {
    microbatches += static_cast<int>(p.find("microbatches")->as_integer());
    nodes += static_cast<int>(p.find("nodes")->as_array().size());
    CHECK(p.find("time_ms")->as_number() <= inst->find("step_ms")->as_number());
    CHECK(p.find("template_nodes")->is_integer());
  }
  CHECK(microbatches == 64);
  CHECK(nodes == 8);
  const auto& events = v.find("events")->as_array();
  REQUIRE(events.size() == 2);
  CHECK(events[0].find("lost")->as_array()[0].as_integer() == 2);
  CHECK(events[0].find("action")->as_string() == "continue");
  CHECK(events[1].find("joined")->as_array().size() == 2);
  CHECK(events[1].find("joined")->as_array()[0].as_integer() == 8);  // next unused id
  const auto& copy = events[1].find("copies")->as_array().at(0);
  for (const char* key : {"layer", "from_node", "to_node", "bytes"}) CHECK(copy.find(key) != nullptr);
}

TEST_CASE("few microbatches per pipeline: no predicted step is shorter than one microbatch's trip") {
  // 4 microbatches over 4 two-node pipelines: one each, fewer than the stages. The paper's closed
  // form predicted less than the forward and backward trip through the stages.
  const auto r = plan({"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1", "--global-batch", "16",
                       "--microbatch", "4", "--json"});
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  std::map<std::int64_t, double> trip;  // template nodes -> sum of stage latencies
  for (const auto& t : v.find("templates")->as_array()) {
    double sum = 0;
    for (const auto& s : t.find("stages")->as_array()) sum += s.find("ms")->as_number();
    trip[t.find("nodes")->as_integer()] = sum;
    CHECK(t.find("makespan_4s_ms")->as_number() >= t.find("iteration_ms")->as_number() * (1 - 1e-12));
  }
  const auto* inst = v.find("instantiation");
  REQUIRE(inst->find("pipelines")->as_array().size() == 4);
  for (const auto& p : inst->find("pipelines")->as_array()) {
    CHECK(p.find("microbatches")->as_integer() == 1);
    CHECK(p.find("time_ms")->as_number() >= trip.at(p.find("template_nodes")->as_integer()) * (1 - 1e-12));
  }
}

TEST_CASE("a join beyond what B/b pipelines can use leaves nodes idle, not an error") {
  // 4 microbatches: at most 4 pipelines of at most 6 nodes, so 4 of the 28 nodes stay idle.
  const auto r = plan({"--profile", kProfile, "--nodes", "8", "--fault-tolerance", "1", "--global-batch", "16",
                       "--microbatch", "4", "--join", "20", "--json"});
  CHECK(r.err.empty());
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  const auto& event = v.find("events")->as_array().at(0);
  CHECK(event.find("action")->as_string() == "continue");
  CHECK(event.find("pipelines")->as_array().size() == 4);
  CHECK(event.find("idle_nodes")->as_array().size() == 4);
}

TEST_CASE("the readable report shows templates, instantiation and events") {
  const auto r = plan(job({"--fail", "2"}));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("n0 = 2, n_max = 6") != std::string::npos);
  CHECK(r.out.find("samples/s") != std::string::npos);
  CHECK(r.out.find("event 1: lost [2] -> continue") != std::string::npos);
}

TEST_CASE("events stop at checkpoint_and_stop") {
  const auto r = plan(job({"--json", "--fail", "0,1,2,3,4", "--fail", "5"}));
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  const auto& events = v.find("events")->as_array();
  REQUIRE(events.size() == 1);
  CHECK(events[0].find("action")->as_string() == "checkpoint_and_stop");
}

TEST_CASE("--template-nodes generates one template") {
  const auto r = plan({"--profile", kProfile, "--template-nodes", "3", "--json"});
  REQUIRE(r.code == 0);
  const auto v = json::parse(r.out);
  REQUIRE(v.find("templates")->as_array().size() == 1);
  CHECK(v.find("templates")->as_array()[0].find("nodes")->as_integer() == 3);
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

TEST_CASE("the oobleck-plan binary exits 2 on a malformed profile") {
  const std::string bad = "/tmp/oobleck-bad-profile-" + std::to_string(::getpid()) + ".json";
  {
    FILE* f = std::fopen(bad.c_str(), "w");
    std::fputs("{\"model\": \"x\", \"layers\": [", f);
    std::fclose(f);
  }
  // timeout(1): pclose() waits for the child, so a hung binary would hang the test; it exits 124.
  const std::string cmd = "timeout 30 " + std::string(OOBLECK_PLAN_BINARY) + " --profile " + bad + " --template-nodes 1 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 256> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = ::pclose(pipe);
  std::remove(bad.c_str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(out.find("JSON syntax error") != std::string::npos);
}
