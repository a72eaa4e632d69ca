// The HTTP status endpoint in-process, with a status source the test controls: what each path
// and method answers, and what hostile or slow clients can (not) do to it. The same server inside
// oobleck-coordinator is tested in tests/actors/coordinator_http_e2e_test.cpp.

#include "apps/http_status.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "apps/dashboard.hpp"
#include "apps/run_history.hpp"
#include "messages/input_error.hpp"
#include "support/tcp_client.hpp"

using namespace oobleck::apps;
using namespace oobleck::messages;
using namespace oobleck::testing;
using namespace std::chrono_literals;

namespace {

job_status sample_status() {
  job_status s;
  s.state = "training";
  s.epoch = 2;
  s.committed_steps = 17;
  s.last_loss = 3.25;
  s.samples_per_second = 120.5;
  s.dropped_messages = 4;
  s.refused_messages = 3;
  s.nodes = {{0, "w0", "training", 0}, {1, "w1", "training", 1}, {2, "w2", "lost", -1}};
  s.pipelines = {{{0, 1}, {0, 3, 6}, 8}};
  return s;
}

/// Answers every request with sample_status() at once.
status_source fixed_source(std::atomic<int>* asked = nullptr) {
  return [asked](std::function<void(status_reply)> done) {
    if (asked) ++*asked;
    done({sample_status(), {}});
  };
}

http_limits fast_limits() {
  http_limits l;
  l.read_timeout = 300ms;
  l.write_timeout = 1s;
  l.status_timeout = 300ms;
  return l;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("status text: Prometheus gauges with HELP and TYPE, every node state, the job state") {
  const std::string text = prometheus_metrics(sample_status());
  for (const char* name : {"oobleck_epoch", "oobleck_committed_steps", "oobleck_last_loss",
                           "oobleck_samples_per_second", "oobleck_dropped_messages", "oobleck_refused_messages", "oobleck_nodes",
                           "oobleck_job_state"}) {
    CAPTURE(name);
    CHECK(text.find(std::string("# HELP ") + name + " ") != std::string::npos);
    CHECK(text.find(std::string("# TYPE ") + name + " gauge\n") != std::string::npos);
  }
  CHECK(text.find("\noobleck_epoch 2\n") != std::string::npos);
  CHECK(text.find("\noobleck_committed_steps 17\n") != std::string::npos);
  CHECK(text.find("\noobleck_last_loss 3.25\n") != std::string::npos);
  CHECK(text.find("\noobleck_samples_per_second 120.5\n") != std::string::npos);
  CHECK(text.find("\noobleck_dropped_messages 4\n") != std::string::npos);
  CHECK(text.find("\noobleck_refused_messages 3\n") != std::string::npos);
  CHECK(text.find("\noobleck_nodes{state=\"training\"} 2\n") != std::string::npos);
  CHECK(text.find("\noobleck_nodes{state=\"lost\"} 1\n") != std::string::npos);
  CHECK(text.find("\noobleck_nodes{state=\"idle\"} 0\n") != std::string::npos);
  CHECK(text.find("\noobleck_nodes{state=\"registered\"} 0\n") != std::string::npos);
  CHECK(text.find("\noobleck_job_state{state=\"training\"} 1\n") != std::string::npos);
  CHECK(text.back() == '\n');
  job_status odd;
  odd.state = "we\"ird\\";
  odd.last_loss = std::numeric_limits<double>::quiet_NaN();
  const std::string t2 = prometheus_metrics(odd);
  CHECK(t2.find("oobleck_job_state{state=\"we\\\"ird\\\\\"} 1") != std::string::npos);
  CHECK(t2.find("\noobleck_last_loss NaN\n") != std::string::npos);
}

TEST_CASE("status JSON: the fields of oobleck-ctl status --json") {
  const auto j = status_json(sample_status());
  CHECK(j["state"] == "training");
  CHECK(j["epoch"] == 2);
  CHECK(j["committed_steps"] == 17);
  CHECK(j["last_loss"] == 3.25);
  CHECK(j["samples_per_second"] == 120.5);
  CHECK(j["dropped_messages"] == 4);
  CHECK(j["refused_messages"] == 3);
  REQUIRE(j["nodes"].size() == 3);
  CHECK(j["nodes"][2] == nlohmann::json{{"node", 2}, {"name", "w2"}, {"state", "lost"}, {"rank", -1}});
  CHECK(j["pipelines"][0] == nlohmann::json{{"nodes", {0, 1}}, {"stage_layers", {0, 3, 6}}, {"microbatches", 8}});
  CHECK(!j.contains("nodes_needed"));  // only while waiting for nodes
}

TEST_CASE("status: a job waiting for nodes says how many it needs (JSON and Prometheus)") {
  auto s = sample_status();
  s.state = "waiting";
  s.nodes_needed = 4;
  CHECK(status_json(s)["nodes_needed"] == 4);
  const std::string text = prometheus_metrics(s);
  CHECK(text.find("\noobleck_nodes_needed 4\n") != std::string::npos);
  CHECK(text.find("\noobleck_job_state{state=\"waiting\"} 1\n") != std::string::npos);
  CHECK(prometheus_metrics(sample_status()).find("\noobleck_nodes_needed 0\n") != std::string::npos);
}

TEST_CASE("http: GET /status is JSON, GET /metrics Prometheus text, other paths 404, other methods 405") {
  http_status_server server("127.0.0.1", 0, fast_limits());
  REQUIRE(server.port() != 0);
  server.start(fixed_source());

  const std::string status = http_get(server.port(), "/status");
  CHECK(starts_with(status, "HTTP/1.1 200 OK\r\n"));
  CHECK(status.find("Content-Type: application/json\r\n") != std::string::npos);
  CHECK(nlohmann::json::parse(http_body(status)) == status_json(sample_status()));

  const std::string metrics = http_get(server.port(), "/metrics?x=1");
  CHECK(starts_with(metrics, "HTTP/1.1 200 OK\r\n"));
  CHECK(metrics.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(http_body(metrics) == prometheus_metrics(sample_status()));

  CHECK(starts_with(http_get(server.port(), "/history"), "HTTP/1.1 404 Not Found\r\n"));  // no history source
  CHECK(starts_with(http_get(server.port(), "/status/x"), "HTTP/1.1 404 Not Found\r\n"));
  CHECK(starts_with(http_get(server.port(), "/index.html"), "HTTP/1.1 404 Not Found\r\n"));
  const auto post = exchange(server.port(),
                             "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
                        .received;
  CHECK(starts_with(post, "HTTP/1.1 405 Method Not Allowed\r\n"));
  CHECK(post.find("Allow: GET\r\n") != std::string::npos);
}

TEST_CASE("http: a kept-alive connection answers one request after the other") {
  http_status_server server("127.0.0.1", 0, fast_limits());
  server.start(fixed_source());
  tcp_client c(server.port());
  c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto r = c.read_until("404 Not Found", 5s);
  CHECK(r.received.find("HTTP/1.1 200 OK") < r.received.find("HTTP/1.1 404 Not Found"));
  // Then it idles past the read deadline: the server closes it.
  CHECK(c.read_until_closed(5s).closed_by_peer);
}

TEST_CASE("http: garbage bytes are 400 or a closed connection, and the server answers afterwards") {
  http_status_server server("127.0.0.1", 0, fast_limits());
  std::atomic<int> asked{0};
  server.start(fixed_source(&asked));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::string junk(1 + rng() % 3000, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    const auto r = exchange(server.port(), junk, 5s);
    CAPTURE(trial);
    CHECK(r.closed_by_peer);
    CHECK((r.received.empty() || starts_with(r.received, "HTTP/1.1 400 Bad Request\r\n") ||
           starts_with(r.received, "HTTP/1.1 413 ")));
  }
  CHECK(starts_with(exchange(server.port(), "\r\n\r\nHELLO\r\n\r\n", 5s).received, "HTTP/1.1 400 Bad Request"));
  CHECK(asked == 0);  // nothing of it reached the coordinator
  CHECK(starts_with(http_get(server.port(), "/status"), "HTTP/1.1 200 OK\r\n"));
  CHECK(asked == 1);
}

TEST_CASE("http: an oversized request is refused without being read whole") {
  http_limits l = fast_limits();
  l.max_request_bytes = 1024;
  http_status_server server("127.0.0.1", 0, l);
  server.start(fixed_source());
  tcp_client c(server.port());
  c.send("GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(64 * 1024, 'a'));  // and never ends
  const auto r = c.read_until_closed(5s);
  CHECK(starts_with(r.received, "HTTP/1.1 413 Payload Too Large\r\n"));
  CHECK(r.closed_by_peer);
}

TEST_CASE("http: a slow client is cut off at the read deadline and never holds up the others") {
  http_status_server server("127.0.0.1", 0, fast_limits());  // read_timeout 300 ms
  server.start(fixed_source());
  tcp_client slow(server.port());
  slow.send("GET /status HTTP/1.1\r\nHo");  // then nothing
  const auto start = std::chrono::steady_clock::now();
  CHECK(starts_with(http_get(server.port(), "/status"), "HTTP/1.1 200 OK\r\n"));
  const auto r = slow.read_until_closed(5s);
  CHECK(r.closed_by_peer);
  CHECK(r.received.empty());
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("http: a status source that does not answer in time is 503, and late answers are dropped") {
  std::mutex m;
  std::vector<std::function<void(status_reply)>> pending;
  http_status_server server("127.0.0.1", 0, fast_limits());  // status_timeout 300 ms
  server.start([&](std::function<void(status_reply)> done) {
    std::lock_guard lock(m);
    pending.push_back(std::move(done));
  });
  const std::string status = http_get(server.port(), "/status", 5s);
  CHECK(starts_with(status, "HTTP/1.1 503 Service Unavailable\r\n"));
  CHECK(nlohmann::json::parse(http_body(status))["error"] == "the coordinator did not answer in time");
  const std::string metrics = http_get(server.port(), "/metrics", 5s);
  CHECK(starts_with(metrics, "HTTP/1.1 503 Service Unavailable\r\n"));
  CHECK(http_body(metrics).find("no status: the coordinator did not answer in time") == 0);
  std::lock_guard lock(m);
  REQUIRE(pending.size() == 2);
  for (auto& done : pending) done({sample_status(), {}});  // too late: nobody is waiting
}

TEST_CASE("http: an error from the source is 503 with its reason") {
  http_status_server server("127.0.0.1", 0, fast_limits());
  server.start([](std::function<void(status_reply)> done) { done({std::nullopt, "bad_proof: no"}); });
  const std::string status = http_get(server.port(), "/status", 5s);
  CHECK(starts_with(status, "HTTP/1.1 503 "));
  CHECK(nlohmann::json::parse(http_body(status))["error"] == "bad_proof: no");
}

TEST_CASE("http: connections beyond max_connections are closed at once") {
  http_limits l = fast_limits();
  l.read_timeout = 10s;
  l.max_connections = 2;
  http_status_server server("127.0.0.1", 0, l);
  server.start(fixed_source());
  tcp_client a(server.port()), b(server.port());
  a.send("G");
  b.send("G");
  std::this_thread::sleep_for(100ms);  // both accepted (a third could not tell otherwise)
  tcp_client c(server.port());
  const auto r = c.read_until_closed(5s);
  CHECK(r.closed_by_peer);
  CHECK(r.received.empty());
}

TEST_CASE("http: a port in use is an error naming the address, and the holder keeps serving") {
  http_status_server first("127.0.0.1", 0, fast_limits());
  first.start(fixed_source());
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  try {
    http_status_server second("127.0.0.1", first.port());
    FAIL("a second server bound a port in use");
  } catch (const input_error& e) {
    CHECK(std::string(e.what()) == "cannot serve HTTP on " + where + ": Address already in use");
  }
  CHECK(starts_with(http_get(first.port(), "/status"), "HTTP/1.1 200 OK\r\n"));
  CHECK_THROWS_AS(http_status_server("no such host.invalid", 0), input_error);
}

TEST_CASE("http: GET / is the dashboard (self-contained HTML) and GET /history the run's history as JSON") {
  run_history history;
  history.add_step({0, 1, 4.5, 200, 80, 1.7e12});
  history.add_step({1, 1, 4.25, 210, 76, 1.7e12 + 80});
  http_status_server server("127.0.0.1", 0, fast_limits());
  server.start(fixed_source(), [&history](std::function<void(std::string)> done) { done(history.json().dump()); });

  const std::string page = http_get(server.port(), "/");
  REQUIRE(starts_with(page, "HTTP/1.1 200 OK\r\n"));
  CHECK(page.find("Content-Type: text/html; charset=utf-8\r\n") != std::string::npos);
  CHECK(page.find("Content-Security-Policy: default-src 'none';") != std::string::npos);
  CHECK(page.find("Cache-Control: no-store\r\n") != std::string::npos);
  const std::string html = http_body(page);
  CHECK(html == dashboard_html());
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  // Nothing from elsewhere: no absolute URL but SVG's namespace name, nothing that loads a file.
  CHECK(html.find("https://") == std::string::npos);
  for (auto at = html.find("http://"); at != std::string::npos; at = html.find("http://", at + 1))
    CHECK(html.compare(at, 27, "http://www.w3.org/2000/svg\"") == 0);
  for (const char* loads : {"<link", "src=", "@import", "url("}) CHECK(html.find(loads) == std::string::npos);
  for (const char* fetched : {"fetch(\"status\"", "fetch(\"history\""}) CHECK(html.find(fetched) != std::string::npos);

  const std::string got = http_get(server.port(), "/history?since=0");
  REQUIRE(starts_with(got, "HTTP/1.1 200 OK\r\n"));
  CHECK(got.find("Content-Type: application/json\r\n") != std::string::npos);
  const auto j = nlohmann::json::parse(http_body(got));
  CHECK(j == nlohmann::json::parse(history.json().dump()));
  CHECK(j["steps"].size() == 2);
  CHECK(j["steps"][1]["loss"] == 4.25);
}

TEST_CASE("http: a history source that does not answer in time is 503, like a status source") {
  std::mutex m;
  std::vector<std::function<void(std::string)>> pending;
  http_status_server server("127.0.0.1", 0, fast_limits());  // status_timeout 300 ms
  server.start(fixed_source(), [&](std::function<void(std::string)> done) {
    std::lock_guard lock(m);
    pending.push_back(std::move(done));
  });
  const std::string got = http_get(server.port(), "/history", 5s);
  CHECK(starts_with(got, "HTTP/1.1 503 Service Unavailable\r\n"));
  CHECK(nlohmann::json::parse(http_body(got))["error"] == "the coordinator did not answer in time");
  CHECK(starts_with(http_get(server.port(), "/status", 5s), "HTTP/1.1 200 OK\r\n"));  // the server goes on
  std::lock_guard lock(m);
  REQUIRE(pending.size() == 1);
  pending[0]("{}");  // too late: nobody is waiting
}
