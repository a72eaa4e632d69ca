#include "apps/sim_command.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/fixtures.hpp"
#include "sim/report.hpp"
#include "support/example_profile.hpp"
#include "support/subprocess.hpp"

using oobleck::apps::run_sim_command;
using oobleck::sim::testing::temp_file;

namespace {

struct result {
  int code;
  std::string out, err;
};

result sim(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = run_sim_command(args, out, err);
  return {code, out.str(), err.str()};
}

const char* kTrace = "0,add,n1\n0,add,n2\n0,add,n3\n0,add,n4\n600000,remove,n2\n1200000,remove,n3\n1800000,add,n5\n3600000,remove,n5\n";

}  // namespace

TEST_CASE("oobleck-sim --json: every policy's throughput, breakdown, decisions and series") {
  const temp_file trace("t.csv", kTrace);
  const auto r = sim({"--model", "gpt2", "--fault-tolerance", "1", "--trace", trace.str(), "--json"});
  REQUIRE(r.code == 0);
  const auto v = nlohmann::json::parse(r.out);
  CHECK(v["model"] == "gpt2");
  CHECK(v["global_batch"] == 8192);
  CHECK(v["microbatch"] == 32);
  CHECK(v["bamboo_microbatch"] == 1);
  CHECK(v["end_s"] == 3600);
  REQUIRE(v["policies"].size() == 3);
  for (const auto& p : v["policies"]) {
    double seconds = 0;
    for (const auto& [k, x] : p["breakdown_s"].items()) seconds += x.get<double>();
    CHECK(seconds == doctest::Approx(3600));
    CHECK(p["samples_per_s"].get<double>() > 0);
    CHECK(p["series"]["samples_per_s"].size() == 300);
    CHECK(p["decisions"].size() >= 1);
  }
  CHECK(v["policies"][0]["policy"] == "oobleck");
  CHECK(v["ratios"]["oobleck/varuna"].get<double>() > 1);
  CHECK(v["recovery_costs"]["source"] == "defaults (no recovery-costs file)");
}

TEST_CASE("oobleck-sim on a measured profile, one policy, recovery costs from a file, a time-scaled trace") {
  const temp_file trace("t.csv",
                        "0,add,a\r\n0,add,b\r\n0,add,c\r\n0,add,d\r\n0,add,e\r\n60000,remove,b\r\n120000,add,f\r\n");
  const temp_file costs("costs.json", R"({"detection_ms": 5, "planning_ms": 20, "copy_bytes_per_s": 1e9,
                                          "source": "fault-tolerance benchmark", "measured": {"runs": 3}})");
  const auto r = sim({"--profile", kProfile, "--fault-tolerance", "1", "--global-batch", "256", "--microbatch", "4",
                      "--trace", trace.str(), "--policy", "oobleck", "--recovery-costs", costs.str(),
                      "--time-scale", "0.01", "--ready-delay-s", "0.5", "--json"});
  REQUIRE(r.code == 0);
  const auto v = nlohmann::json::parse(r.out);
  REQUIRE(v["policies"].size() == 1);
  CHECK(v["end_s"] == doctest::Approx(1.2));
  CHECK(v["recovery_costs"]["planning_ms"] == 20);
  CHECK(v["recovery_costs"]["source"].get<std::string>().find("fault-tolerance benchmark") != std::string::npos);
  const auto& decisions = v["policies"][0]["decisions"];
  REQUIRE(decisions.size() == 2);  // f is ready at 1.7 s, after the end
  CHECK(decisions[0]["nodes"] == 5);
  CHECK(decisions[1]["what"] == "reconfigure");
  CHECK(decisions[1]["t_s"] == doctest::Approx(0.6));
  CHECK(decisions[1]["nodes"] == 4);
}

TEST_CASE("oobleck-sim: the table names each policy and the ratios") {
  const temp_file trace("t.csv", kTrace);
  const auto r = sim({"--model", "bert-large", "--fault-tolerance", "1", "--trace", trace.str()});
  REQUIRE(r.code == 0);
  for (const char* s : {"oobleck ", "varuna ", "bamboo ", "Oobleck / varuna: ", "Oobleck / bamboo: ", "effective",
                        "fallback", "restart"})
    CHECK(r.out.find(s) != std::string::npos);
}

TEST_CASE("oobleck-sim: bad input is one error line and status 2") {
  const temp_file unknown("unknown.csv", "0,add,a\n0,add,b\n10,remove,zz\n");
  const temp_file negative("negative.csv", "0,add,a\n-10,add,b\n");
  const temp_file garbage("garbage.csv", "0,add,a\n0,add,b\n\nnot a line\n");
  const temp_file good("good.csv", kTrace);
  const temp_file typo("costs.json", R"({"detection": 5})");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--trace", unknown.str()}, "line 3: node 'zz' is removed at 10 ms but is not present"},
      {{"--trace", negative.str()}, "line 2: negative time -10"},
      {{"--trace", garbage.str()}, "line 4: 1 fields"},
      {{"--trace", good.str() + ".missing"}, "cannot read trace file"},
      {{"--trace", good.str(), "--recovery-costs", typo.str()}, "unknown key 'detection'"},
      {{"--trace", good.str(), "--policy", "elastic"}, "--policy: unknown policy 'elastic'"},
      {{"--trace", good.str(), "--policy", "oobleck,"}, "--policy: unknown policy ''"},
      {{}, "give exactly one of --trace and --random-failures"},
      {{"--trace", good.str(), "--random-failures"}, "give exactly one of --trace and --random-failures"},
      {{"--random-failures", "--duration-s", "60"}, "--random-failures needs --nodes"},
      {{"--random-failures", "--nodes", "4"}, "--random-failures needs --duration-s"},
      {{"--trace", good.str(), "--mttf-h", "2"}, "--mttf-h goes with --random-failures, not --trace"},
      {{"--random-failures", "--nodes", "4", "--duration-s", "60", "--time-scale", "2"},
       "--time-scale goes with --trace, not --random-failures"},
      {{"--random-failures", "--nodes", "4", "--duration-s", "60", "--mttf-h", "0"}, "--mttf-h must be >= 1e-09"},
      {{"--trace", good.str(), "--profile", kProfile}, "give exactly one of --profile and --model"},
      {{"--trace", good.str(), "--time-scale", "0"}, "--time-scale must be >= 1e-09"},
      {{"--trace", good.str(), "--nodes", "1"}, "f = 1 needs 2 pipelines of at least n0 = 1 nodes"},
  };
  for (const auto& [extra, expected] : cases) {
    std::vector<std::string> args{"--model", "gpt2", "--fault-tolerance", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    CAPTURE(expected);
    const auto r = sim(args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  const auto model = sim({"--model", "gpt5", "--fault-tolerance", "1", "--trace", good.str()});
  CHECK(model.code == 2);
  CHECK(model.err.find("unknown model 'gpt5' (known: bert-large, gpt2, gpt3-medium, gpt3-2.7b, gpt3-6.7b, dense-400b)") !=
        std::string::npos);
}

TEST_CASE("oobleck-sim: a bad trace through the program's root is exit status 2 naming the line") {
  const temp_file garbage("garbage.csv", "0,add,a\n0,add,b\n5,explode,a\n");
  const auto r = oobleck::testing::run_process(OOBLECK_SIM_BINARY,
                                               {"--model", "gpt2", "--fault-tolerance", "1", "--trace", garbage.str()});
  CHECK(r.exit_status == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("error: " + garbage.str() + " line 3: unknown action 'explode'") == 0);
}

TEST_CASE("oobleck-sim --plot: a PNG with gnuplot, a clear error without it") {
  const temp_file trace("t.csv", kTrace);
  const temp_file png("out.png", "");
  const char* path = std::getenv("PATH");
  const std::string saved = path ? path : "";
  setenv("PATH", png.dir.c_str(), 1);  // a directory without gnuplot
  const auto r = sim({"--model", "gpt2", "--fault-tolerance", "1", "--trace", trace.str(), "--plot", png.str()});
  setenv("PATH", saved.c_str(), 1);
  CHECK(r.code == 2);
  CHECK(r.err.find("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)") !=
        std::string::npos);
  if (oobleck::sim::find_gnuplot().empty()) return;  // the rest needs gnuplot (scripts/install-deps.sh)
  std::filesystem::remove(png.path);
  const auto ok = sim({"--model", "gpt2", "--fault-tolerance", "1", "--trace", trace.str(), "--plot", png.str()});
  CHECK(ok.code == 0);
  std::ifstream in(png.path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  CHECK(std::string(magic + 1, 3) == "PNG");
}

TEST_CASE("oobleck-sim: --random-failures draws a seeded failure sequence and compares the policies for that scale") {
  const std::vector<std::string> base{"--model", "gpt2", "--fault-tolerance", "1", "--random-failures", "--nodes", "8",
                                      "--spare-nodes", "1", "--mttf-h", "1", "--repair-h", "2", "--duration-s", "36000",
                                      "--json"};
  auto with_seed = [&](const char* seed) {
    auto args = base;
    args.insert(args.end(), {"--seed", seed});
    const auto r = sim(args);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto v = with_seed("5");
  CHECK(v["trace"].get<std::string>().find("MTTF 1 h over 8 nodes, 1 spares, repair 2 h, seed 5") != std::string::npos);
  REQUIRE(v["policies"].size() == 3);
  std::vector<std::string> names;
  for (const auto& p : v["policies"]) {
    names.push_back(p["policy"].get<std::string>());
    const double share = p["effective_share"].get<double>();
    CHECK(share > 0);
    CHECK(share < 1);  // ten hours at one failure an hour cost every policy something
    CHECK(p["failure_free_samples_per_s"].get<double>() > 0);
    CHECK(p["lost_s"]["reconfiguration"].get<double>() + p["lost_s"]["restart"].get<double>() > 0);
  }
  CHECK(names == std::vector<std::string>{"oobleck", "ckpt-restart", "torchft"});
  CHECK(with_seed("5") == v);  // the same seed, the same run
  CHECK(with_seed("6")["policies"][0]["decisions"] != v["policies"][0]["decisions"]);
}
