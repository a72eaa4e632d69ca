// The dashboard (GET /) as a user sees it: rendered by a real headless browser (Debian's chromium),
// its scripts run, then its DOM read for content: the nodes' names and states, the pipelines and
// their stages, a loss curve with a point per step, eval points and reconfiguration marks; and a
// screenshot taken, checked to be a PNG of the window's size (content is checked in the DOM, not
// in pixels). Once against the HTTP server in-process with a status and a history the test
// controls, once against oobleck-local training a small job. Skipped, saying so, without chromium.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/http_status.hpp"
#include "apps/local_options.hpp"
#include "apps/run_history.hpp"
#include "support/local_run.hpp"
#include "support/subprocess.hpp"
#include "support/tcp_client.hpp"
#include "support/temp_dir.hpp"

using namespace oobleck::apps;
using namespace oobleck::testing;
using oobleck::messages::event_kind;
using namespace std::chrono_literals;

namespace {

/// chromium on PATH (Debian's name, then others'), or empty.
std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin");
  std::vector<std::string> list;
  for (std::string d; std::getline(dirs, d, ':');) list.push_back(d);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    for (const auto& d : list)
      if (::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return {};
}

/// A run of headless chromium on `url` with `extra` flags (its scripts get `budget_ms` of virtual
/// time, after the page's network requests); at most 90 s (coreutils' timeout).
process_result chromium(const std::string& browser, const std::filesystem::path& profile, const std::string& url,
                        std::vector<std::string> extra, int budget_ms = 4000) {
  std::vector<std::string> args{"90", browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
                                "--no-first-run", "--user-data-dir=" + profile.string(),
                                "--virtual-time-budget=" + std::to_string(budget_ms)};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(url);
  return run_process("/usr/bin/timeout", args);
}

/// The rendered DOM of `url`, after its scripts ran.
std::string rendered_dom(const std::string& browser, const std::filesystem::path& profile, const std::string& url) {
  const auto r = chromium(browser, profile, url, {"--dump-dom"});
  INFO("chromium's stderr: " << r.err);
  REQUIRE(r.exit_status == 0);
  REQUIRE(r.out.find("</html>") != std::string::npos);
  return r.out;
}

/// The attributes of every start tag `tag` of the DOM (as chromium serializes it: name="value")
/// that has `cls` among its classes (any, when `cls` is empty). Read by hand: std::regex recurses
/// per character and overflows the stack on a page this long.
std::vector<std::map<std::string, std::string>> elements(const std::string& dom, const std::string& tag,
                                                         const std::string& cls) {
  std::vector<std::map<std::string, std::string>> found;
  const std::string open = "<" + tag;
  for (auto at = dom.find(open); at != std::string::npos; at = dom.find(open, at + 1)) {
    std::size_t i = at + open.size();
    if (i >= dom.size() || (dom[i] != ' ' && dom[i] != '>')) continue;  // <tbody> is not <tr>...
    std::map<std::string, std::string> attrs;
    while (i < dom.size() && dom[i] != '>') {
      while (i < dom.size() && dom[i] == ' ') ++i;
      const auto eq = dom.find('=', i), end = dom.find('>', i);
      if (eq == std::string::npos || eq > end || dom[eq + 1] != '"') break;
      const auto close = dom.find('"', eq + 2);
      attrs[dom.substr(i, eq - i)] = dom.substr(eq + 2, close - eq - 2);
      i = close + 1;
    }
    std::stringstream classes(attrs["class"]);
    bool match = cls.empty();
    for (std::string c; classes >> c;) match = match || c == cls;
    if (match) found.push_back(std::move(attrs));
  }
  return found;
}

/// The one path of `cls` in the chart `chart_id` (the charts are consecutive <svg> elements).
std::map<std::string, std::string> series(const std::string& dom, const std::string& chart_id, const std::string& cls) {
  const auto from = dom.find("id=\"" + chart_id + "\"");
  REQUIRE(from != std::string::npos);
  const auto to = dom.find("</svg>", from);
  const auto paths = elements(dom.substr(from, to - from), "path", cls);
  REQUIRE(paths.size() == 1);
  return paths[0];
}

/// The number of points a path's `d` draws (M and L commands).
std::size_t points_drawn(const std::string& d) {
  return static_cast<std::size_t>(std::count_if(d.begin(), d.end(), [](char c) { return c == 'M' || c == 'L'; }));
}

/// Width and height of a PNG file; (0, 0) when it is not one.
std::pair<std::uint32_t, std::uint32_t> png_size(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char head[24] = {};
  if (!in.read(reinterpret_cast<char*>(head), sizeof head)) return {0, 0};
  static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (!std::equal(signature, signature + 8, head) || std::string(reinterpret_cast<char*>(head + 12), 4) != "IHDR")
    return {0, 0};
  auto be = [&](int at) {
    return std::uint32_t{head[at]} << 24 | std::uint32_t{head[at + 1]} << 16 | std::uint32_t{head[at + 2]} << 8 |
           std::uint32_t{head[at + 3]};
  };
  return {be(16), be(20)};
}

/// Checks a screenshot of `url`: a PNG of the window's size, not a blank one.
void check_screenshot(const std::string& browser, const std::filesystem::path& dir, const std::string& url) {
  const auto png = dir / "dashboard.png";
  const auto r = chromium(browser, dir / "profile", url, {"--window-size=1280,900", "--screenshot=" + png.string()});
  INFO("chromium's stderr: " << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK(png_size(png) == std::pair<std::uint32_t, std::uint32_t>{1280, 900});
  // A blank 1280x900 page compresses to a few kilobytes; text, tables and curves do not.
  CHECK(std::filesystem::file_size(png) > 20000);
}

bool skip_without_chromium(const std::string& browser) {
  if (!browser.empty()) return false;
  MESSAGE("SKIPPED: chromium is not installed (Debian: apt-get install chromium; scripts/install-deps.sh)");
  return true;
}

/// A TCP port nobody listens on now (bound to 0, then released).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// The default job with `edits` (text replaced) and the coordinator's HTTP endpoint on `port`.
std::string local_job(const std::vector<std::pair<std::string, std::string>>& edits, std::uint16_t port) {
  std::string job = default_local_job;
  for (const auto& [from, to] : edits) {
    const auto at = job.find(from);
    REQUIRE(at != std::string::npos);
    job.replace(at, from.size(), to);
  }
  return job + "\n[http]\nport = " + std::to_string(port) + "\n";
}

oobleck::messages::job_status fixed_status() {
  oobleck::messages::job_status s;
  s.state = "training";
  s.epoch = 3;
  s.committed_steps = 40;
  s.last_loss = 2.5;
  s.samples_per_second = 321.5;
  s.nodes = {{0, "alpha-node", "training", 0}, {1, "beta-node", "training", 1}, {2, "gamma-node", "training", 2},
             {3, "delta-node", "training", 3}, {4, "omega-node", "lost", -1}};
  s.pipelines = {{{0, 1}, {0, 4, 8}, 6}, {{2, 3}, {0, 5, 8}, 2}};
  return s;
}

}  // namespace

TEST_CASE("dashboard in chromium: nodes, pipelines and stages, a loss curve point per step, evals, reconfigurations, refreshed") {
  const std::string browser = find_chromium();
  if (skip_without_chromium(browser)) return;
  temp_dir dir("oobleck-dashboard-");
  constexpr std::uint64_t first_steps = 37;
  run_history history;
  for (std::uint64_t k = 0; k < first_steps; ++k)
    history.add_step({k, 1 + k / 20, 5.5 - 0.05 * static_cast<double>(k), 300 + static_cast<double>(k % 7), 50, 1.7e12});
  for (std::uint64_t k : {9, 19, 29}) history.add_eval({k, 5.0 - 0.04 * static_cast<double>(k), 4, 1.7e12});
  history.add_reconfiguration({20, 2, "borrow+merge", {4}, {}, 2500, 1.7e12});
  history.add_reconfiguration({31, 3, "unchanged", {}, {5}, 900, 1.7e12});
  // Every answer of /history has one more step than the one before: the page must show the newest.
  std::atomic<int> asked{0};
  std::mutex m;
  http_status_server server("127.0.0.1", 0);
  server.start([](std::function<void(status_reply)> done) { done({fixed_status(), {}}); },
               [&](std::function<void(std::string)> done) {
                 std::lock_guard lock(m);
                 const auto k = first_steps + static_cast<std::uint64_t>(asked++);
                 history.add_step({k, 3, 3.0, 310, 50, 1.7e12});
                 done(history.json().dump());
               });
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/";
  const std::string dom = rendered_dom(browser, dir.path() / "profile", url);
  INFO("the rendered DOM:\n" << dom);

  // The nodes, each with its state.
  const auto status = fixed_status();
  const auto rows = elements(dom, "tr", "node");
  REQUIRE(rows.size() == status.nodes.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& n = status.nodes[i];
    CHECK(rows[i].at("data-node") == std::to_string(n.node));
    CHECK(rows[i].at("data-name") == n.name);
    CHECK(rows[i].at("data-state") == n.state);
    CHECK(dom.find(">" + n.name + "<") != std::string::npos);  // shown, not only an attribute
  }
  // The pipelines and their stages: nodes in stage order, the layers of each stage.
  CHECK(elements(dom, "div", "pipeline").size() == 2);
  const auto stages = elements(dom, "div", "stage");
  REQUIRE(stages.size() == 4);
  const std::vector<std::array<const char*, 3>> expected{{"0", "0", "0"}, {"0", "1", "1"}, {"1", "0", "2"}, {"1", "1", "3"}};
  for (std::size_t i = 0; i < stages.size(); ++i) {
    CHECK(stages[i].at("data-pipeline") == expected[i][0]);
    CHECK(stages[i].at("data-stage") == expected[i][1]);
    CHECK(stages[i].at("data-node") == expected[i][2]);
  }
  CHECK(dom.find("layers 0–3") != std::string::npos);
  CHECK(dom.find("layers 5–7") != std::string::npos);

  // The curves: a loss point per step the last rendered history had, refreshed after the first.
  const auto body = elements(dom, "body", "");
  REQUIRE(body.size() == 1);
  const auto rendered = std::stoul(body[0].at("data-updates"));
  CHECK(rendered >= 2);  // polled again: the page is live
  CHECK(rendered <= static_cast<unsigned long>(asked.load()));
  const auto loss = series(dom, "loss-chart", "loss");
  CHECK(loss.at("data-points") == std::to_string(first_steps + rendered));
  CHECK(points_drawn(loss.at("d")) == first_steps + rendered);
  const auto eval = series(dom, "loss-chart", "eval");
  CHECK(eval.at("data-points") == "3");
  CHECK(dom.find("<b id=\"job-eval\">3.8400 at step 29</b>") != std::string::npos);  // the newest eval, in the header
  CHECK(series(dom, "speed-chart", "speed").at("data-points") == std::to_string(first_steps + rendered));
  // Reconfigurations marked on both charts, at their steps.
  const auto marks = elements(dom, "line", "reconfiguration");
  REQUIRE(marks.size() == 4);
  CHECK(marks[0].at("data-step") == "20");
  CHECK(marks[1].at("data-step") == "31");
  CHECK(dom.find("epoch 2 at step 20: borrow+merge, lost 4") != std::string::npos);

  check_screenshot(browser, dir.path(), url);
}

TEST_CASE("dashboard in chromium: oobleck-local training a small job shows its workers, its pipeline, its steps and evals") {
  const std::string browser = find_chromium();
  if (skip_without_chromium(browser)) return;
  temp_dir dir("oobleck-dashboard-local-");
  // The default job on 2 nodes (the model does not fit one: one pipeline of two stages), f = 0,
  // evaluated every 2 steps on a token file of random ids, with the coordinator's HTTP endpoint on
  // a free port.
  const std::uint16_t port = free_port();
  const auto validation = dir.path() / "val.bin";
  {
    std::mt19937 rng(3);
    std::vector<std::uint16_t> tokens(2048);
    for (auto& t : tokens) t = static_cast<std::uint16_t>(rng() % 256);
    std::ofstream(validation, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  std::ofstream(dir.path() / "job.toml")
      << local_job({{"nodes = 6", "nodes = 2"},
                    {"fault_tolerance = 1", "fault_tolerance = 0"},
                    {"[data]\n", "[data]\nvalidation = \"" + validation.string() + "\"\n"}},
                   port)
      << "\n[eval]\nevery = 2\nwindows = 4\n";
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";

  const auto run = run_to_end(
      std::string(OOBLECK_APPS_DIR) + "/oobleck-local",
      {"--config", (dir.path() / "job.toml").string(), "--steps", "100000", "--timeout", "150"}, "",
      (dir.path() / "events.jsonl").string(), 60s, [&](running_local& local) {
        local.wait_for({.kind = event_kind::step_committed, .step = 3}, 90s);
        nlohmann::json before;
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        do {  // until an evaluation round is in the history
          REQUIRE(std::chrono::steady_clock::now() < deadline);
          before = nlohmann::json::parse(http_body(http_get(port, "/history")));
        } while (before["evals"].empty());
        const auto status = nlohmann::json::parse(http_body(http_get(port, "/status")));
        const std::string dom = rendered_dom(browser, dir.path() / "profile", url);
        const auto after = nlohmann::json::parse(http_body(http_get(port, "/history")));
        INFO("the rendered DOM:\n" << dom);
        INFO("the status:\n" << status.dump(2));
        const auto rows = elements(dom, "tr", "node");
        REQUIRE(rows.size() == 2);
        for (std::size_t i = 0; i < 2; ++i) {
          CHECK(rows[i].at("data-name") == status["nodes"][i]["name"]);
          CHECK(rows[i].at("data-state") == "training");
        }
        CHECK(rows[0].at("data-name") != rows[1].at("data-name"));
        REQUIRE(status["pipelines"].size() == 1);
        const auto stages = elements(dom, "div", "stage");
        REQUIRE(stages.size() == 2);
        for (std::size_t k = 0; k < 2; ++k)
          CHECK(stages[k].at("data-node") == std::to_string(status["pipelines"][0]["nodes"][k].get<int>()));
        // A point per step committed when the page last asked: between what we saw before and after.
        const auto loss = series(dom, "loss-chart", "loss");
        const auto n = std::stoul(loss.at("data-points"));
        CHECK(n >= before["steps_seen"].get<unsigned long>());
        CHECK(n <= after["steps_seen"].get<unsigned long>());
        CHECK(points_drawn(loss.at("d")) == n);
        const auto evals = std::stoul(series(dom, "loss-chart", "eval").at("data-points"));
        CHECK(evals >= before["evals"].size());
        CHECK(evals <= after["evals"].size());
        for (const auto& e : after["evals"]) {
          CHECK(e["windows"] == 4);
          CHECK(e["loss"].is_number());
          CHECK(e["step"].get<int>() % 2 == 1);  // after steps 1, 3, 5, ...: every 2 committed steps
        }
        // The history's own steps: numbered from 0, losses finite.
        REQUIRE(after["steps"].size() >= 4);
        for (std::size_t k = 0; k < after["steps"].size(); ++k) {
          CHECK(after["steps"][k]["step"] == k);
          CHECK(after["steps"][k]["loss"].is_number());
        }
        check_screenshot(browser, dir.path(), url);
        local.process.signal(SIGTERM);  // an orderly stop of the job
      });
  INFO("oobleck-local's output:\n" << run.output);
  CHECK(run.status == 0);
}

TEST_CASE("dashboard in chromium: a node killed during an oobleck-local run is lost, its reconfiguration marked") {
  const std::string browser = find_chromium();
  if (skip_without_chromium(browser)) return;
  temp_dir dir("oobleck-dashboard-lost-");
  // 3 nodes, f = 1, the model on one node: losing one leaves enough to go on.
  const std::uint16_t port = free_port();
  std::ofstream(dir.path() / "job.toml")
      << local_job({{"nodes = 6", "nodes = 3"}, {"device_memory_bytes = 1500000", ""}}, port);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  const auto run = run_to_end(
      std::string(OOBLECK_APPS_DIR) + "/oobleck-local",
      {"--config", (dir.path() / "job.toml").string(), "--steps", "100000", "--timeout", "150", "--fail-at", "3:1"}, "",
      (dir.path() / "events.jsonl").string(), 60s, [&](running_local& local) {
        local.wait_for({.kind = event_kind::node_lost, .node = 1}, 90s);
        // The epoch that took over without node 1 (a failed step may have re-formed the old one
        // first: epochs are not counted here), and a step committed after it.
        nlohmann::json history, reconfiguration;
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        for (;;) {
          history = nlohmann::json::parse(http_body(http_get(port, "/history")));
          for (const auto& r : history["reconfigurations"])
            if (r["lost"] == nlohmann::json::array({1})) reconfiguration = r;
          if (!reconfiguration.is_null() && !history["last_step"].is_null() &&
              history["last_step"]["step"].get<int>() > reconfiguration["step"].get<int>())
            break;
          INFO("the history:\n" << history.dump(2));
          REQUIRE(std::chrono::steady_clock::now() < deadline);
          std::this_thread::sleep_for(100ms);
        }
        INFO("the history:\n" << history.dump(2));
        CHECK(reconfiguration["epoch"].get<int>() >= 2);
        std::set<std::string> steps;
        for (const auto& r : history["reconfigurations"]) steps.insert(std::to_string(r["step"].get<int>()));
        const std::string dom = rendered_dom(browser, dir.path() / "profile", url);
        INFO("the rendered DOM:\n" << dom);
        const auto rows = elements(dom, "tr", "node");
        REQUIRE(rows.size() == 3);
        CHECK(rows[1].at("data-state") == "lost");
        CHECK(rows[0].at("data-state") == "training");
        CHECK(rows[2].at("data-state") == "training");
        for (const auto& stage : elements(dom, "div", "stage")) CHECK(stage.at("data-node") != "1");
        // Each reconfiguration marked on the loss chart and on the samples/s chart, at its step (the
        // page may have asked once more since: as many as then, or more).
        const auto marks = elements(dom, "line", "reconfiguration");
        const auto items = elements(dom, "li", "reconfiguration-item");
        CHECK(marks.size() == 2 * items.size());
        CHECK(items.size() >= history["reconfigurations"].size());
        for (const auto& m : marks) CHECK(steps.count(m.at("data-step")) == 1);
        CHECK(std::any_of(marks.begin(), marks.end(), [&](const auto& m) {
          return m.at("data-step") == std::to_string(reconfiguration["step"].get<int>());
        }));
        CHECK(dom.find("lost 1") != std::string::npos);
        local.process.signal(SIGTERM);
      });
  INFO("oobleck-local's output:\n" << run.output);
  CHECK(run.status == 0);
}
