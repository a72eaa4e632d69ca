// oobleck-report as a user meets it: a metrics file of the form --metrics-out writes, written here
// with its values drawn at random, summed up (values checked against what the test computes from
// its own numbers), drawn into a PNG with gnuplot, and bad files refused with their line number.

#include "apps/report_command.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/program_main.hpp"
#include "sim/report.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck::apps;
using oobleck::testing::temp_dir;

namespace {

struct outcome {
  int status = -1;
  std::string out, err;
};

outcome report(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  outcome o;
  o.status = exit_status_of(err, [&] { return run_report_command(args, out, err); });
  o.out = out.str();
  o.err = err.str();
  return o;
}

/// A run's metrics as --metrics-out writes them, with the numbers it wrote.
struct written_run {
  std::vector<double> loss, wall_ms;
  std::vector<std::int64_t> samples;
  std::vector<std::pair<std::uint64_t, double>> evals;  // step, loss
  std::string text;
};

written_run write_run(const std::filesystem::path& file, int steps, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  written_run w;
  std::ostringstream f;
  for (int k = 0; k < steps; ++k) {
    w.loss.push_back(5.5 * std::exp(-0.05 * k) * jitter(rng));
    w.wall_ms.push_back(40 * jitter(rng));
    w.samples.push_back(16);
    nlohmann::ordered_json j;
    j["step"] = k;
    j["epoch"] = k < 12 ? 1 : 2;
    j["loss"] = w.loss.back();
    j["samples"] = w.samples.back();
    j["pipelines"] = nlohmann::json::array();
    j["layer_digests"] = nlohmann::json::object();
    j["wall_ms"] = w.wall_ms.back();
    j["breakdown"] = {{"compute_ms", 1.0}};
    j["unix_ms"] = 1.7e12 + 50.0 * k;
    f << j.dump() << "\n";
    if (k == 11)
      f << R"({"event":"reconfigured","epoch":2,"lost":[3],"joined":[],"action":"borrow+merge","detect_ms":10,"plan_ms":1,)"
           R"("copy_bytes":0,"copy_ms":0,"copy_wait_ms":0,"connect_ms":0,"prepare_ms":0,"views_ms":0,"form_ms":5,)"
           R"("resumed_step":12,"downtime_ms":1520.5})"
        << "\n";
    if (k % 5 == 4) {
      w.evals.push_back({static_cast<std::uint64_t>(k), 5.0 * std::exp(-0.04 * k) * jitter(rng)});
      f << nlohmann::json{{"event", "eval"}, {"step", k}, {"loss", w.evals.back().second}, {"windows", 8}}.dump() << "\n";
    }
  }
  f << R"({"event":"checkpoint_and_stop","reason":"x","dir":null,"latest":null,"step":3})" << "\n\n";
  w.text = f.str();
  std::ofstream(file) << w.text;
  return w;
}

}  // namespace

TEST_CASE("oobleck-report: the summary's figures are the metrics file's") {
  temp_dir dir("oobleck-report-");
  const auto file = dir.path() / "metrics.jsonl";
  const auto w = write_run(file, 23, 5);
  const auto r = report({file.string(), "--json"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["steps"] == 23);
  CHECK(j["first_step"] == 0);
  CHECK(j["last_step"] == 22);
  CHECK(j["final_loss"].get<double>() == w.loss.back());
  const auto lowest = std::min_element(w.loss.begin(), w.loss.end());
  CHECK(j["lowest_loss"]["loss"].get<double>() == *lowest);
  CHECK(j["lowest_loss"]["step"] == lowest - w.loss.begin());
  double samples = 0, ms = 0;
  for (std::size_t k = 0; k < w.loss.size(); ++k) {
    samples += static_cast<double>(w.samples[k]);
    ms += w.wall_ms[k];
  }
  CHECK(j["mean_samples_per_second"].get<double>() == doctest::Approx(1000 * samples / ms).epsilon(1e-12));
  CHECK(j["mean_step_ms"].get<double>() == doctest::Approx(ms / 23).epsilon(1e-12));
  const auto best = std::min_element(w.evals.begin(), w.evals.end(), [](auto& a, auto& b) { return a.second < b.second; });
  CHECK(j["evals"] == w.evals.size());
  CHECK(j["best_eval"]["loss"].get<double>() == best->second);
  CHECK(j["best_eval"]["step"] == best->first);
  CHECK(j["best_eval"]["windows"] == 8);
  CHECK(j["final_eval"]["step"] == w.evals.back().first);
  CHECK(j["reconfigurations"] == 1);

  // The text says the same for people.
  const auto text = report({file.string()});
  REQUIRE(text.status == 0);
  char buf[64];
  std::snprintf(buf, sizeof buf, "final %.6g at step 22", w.loss.back());
  CHECK(text.out.find(buf) != std::string::npos);
  std::snprintf(buf, sizeof buf, "mean %.1f", 1000 * samples / ms);
  CHECK(text.out.find(buf) != std::string::npos);
  std::snprintf(buf, sizeof buf, "best %.6g at step %llu", best->second, static_cast<unsigned long long>(best->first));
  CHECK(text.out.find(buf) != std::string::npos);
  CHECK(text.out.find("23 committed step(s)") != std::string::npos);
  CHECK(text.out.find("epoch 2 at step 12: borrow+merge, lost node(s) 3, down 1.52 s") != std::string::npos);
}

TEST_CASE("oobleck-report: a step recorded again by a resumed run counts once, with its last record") {
  temp_dir dir("oobleck-report-");
  const auto file = dir.path() / "metrics.jsonl";
  std::ofstream(file) << R"({"step":0,"loss":4,"samples":8,"wall_ms":10})" "\n"
                      << R"({"step":1,"loss":3,"samples":8,"wall_ms":10})" "\n"
                      << R"({"step":1,"loss":2.5,"samples":8,"wall_ms":30})" "\n";
  const auto r = report({file.string(), "--json"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["steps"] == 2);
  CHECK(j["repeated_steps"] == 1);
  CHECK(j["final_loss"] == 2.5);
  CHECK(j["mean_samples_per_second"].get<double>() == doctest::Approx(1000.0 * 16 / 40));
  CHECK(j["best_eval"].is_null());
}

TEST_CASE("oobleck-report --plot: a PNG of the curves") {
  if (oobleck::sim::find_gnuplot().empty()) {
    MESSAGE("gnuplot is not installed: --plot must say so");
    temp_dir dir("oobleck-report-");
    write_run(dir.path() / "m.jsonl", 3, 1);
    const auto r = report({(dir.path() / "m.jsonl").string(), "--plot", (dir.path() / "run.png").string()});
    CHECK(r.status == 2);
    CHECK(r.err.find("gnuplot") != std::string::npos);
    return;
  }
  temp_dir dir("oobleck-report-");
  const auto file = dir.path() / "metrics.jsonl";
  write_run(file, 40, 9);
  const auto png = dir.path() / "run's plot.png";  // a quote in the name reaches gnuplot intact
  const auto r = report({file.string(), "--plot", png.string()});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  REQUIRE(std::filesystem::exists(png));
  std::ifstream in(png, std::ios::binary);
  unsigned char head[24] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  CHECK(std::string(reinterpret_cast<char*>(head) + 1, 3) == "PNG");
  auto be = [&](int at) { return head[at] << 24 | head[at + 1] << 16 | head[at + 2] << 8 | head[at + 3]; };
  CHECK(be(16) == 1100);
  CHECK(be(20) == 750);
  CHECK(std::filesystem::file_size(png) > 10000);
  CHECK(r.out.find("wrote " + png.string()) != std::string::npos);
  // Nothing to draw is said, not drawn blank.
  const auto empty = dir.path() / "empty.jsonl";
  std::ofstream(empty) << R"({"event":"eval","step":0,"loss":3,"windows":2})" "\n";
  const auto e = report({empty.string(), "--plot", (dir.path() / "e.png").string()});
  CHECK(e.status == 2);
  CHECK(e.err.find("no step records") != std::string::npos);
}

TEST_CASE("oobleck-report: a bad line is refused with its number, a missing file and flags too") {
  temp_dir dir("oobleck-report-");
  const auto file = dir.path() / "metrics.jsonl";
  const std::string good = R"({"step":0,"loss":4,"samples":8,"wall_ms":10})";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"step\":1,\"loss\":", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"loss":3})", "no \"step\""},
      {R"({"step":-1,"loss":3})", "\"step\" is not a count"},
      {R"({"step":1,"loss":"low"})", "\"loss\" is not a number"},
      {R"({"event":"eval","step":1,"loss":3})", "no \"windows\""},
      {R"({"event":"reconfigured","epoch":2,"resumed_step":1,"action":"simple","lost":["a"],"joined":[]})",
       "\"lost\" is not a list of integers"},
      {R"({"event":7})", "\"event\" is not a string"},
  };
  for (const auto& [line, says] : cases) {
    CAPTURE(line);
    std::ofstream(file) << good << "\n\n" << line << "\n" << good << "\n";
    const auto r = report({file.string()});
    CHECK(r.status == 2);
    CHECK(r.err.find(file.string() + ":3: " + says) != std::string::npos);
    CHECK(r.out.empty());
  }
  const auto missing = report({(dir.path() / "nope.jsonl").string()});
  CHECK(missing.status == 2);
  CHECK(missing.err.find("cannot open the metrics file") != std::string::npos);
  CHECK(report({}).status == 2);
  const auto help = report({"--help"});
  CHECK(help.status == 0);
  CHECK(help.out.find("--plot") != std::string::npos);
  CHECK(help.out.find("METRICS") != std::string::npos);
}
