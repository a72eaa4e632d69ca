// How fast the host transport turns a failure into failed operations, with ranks as processes on
// loopback: a peer killed with kill -9, abort() while a peer is frozen (SIGSTOP), and a receiver
// that is frozen or killed under a large send. The tests only bound these (they must fail, not
// hang: tests/runtime/transport_process_test.cpp); the milliseconds are measured here. Times are
// CLOCK_MONOTONIC, shared by every process of the machine.
//
// usage: transport_failure_latency [--quick] [--runs N] [--json PATH]

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include "bench/bench_flags.hpp"
#include "runtime/transport/forked_ranks.hpp"
#include "runtime/transport/host_transport.hpp"

using namespace oobleck;
using runtime::host_transport;
using runtime::transport_error;
using runtime::forked_ranks::join_mesh;
using runtime::forked_ranks::parent_line;
using runtime::forked_ranks::process_group;
using ordered_json = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {

long long now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

std::vector<int> everyone(int n) {
  std::vector<int> g;
  for (int r = 0; r < n; ++r) g.push_back(r);
  return g;
}

/// Child: an operation blocked on a thread; `failed_ns` is when it threw transport_error
/// (-1: it completed, which none of these operations may).
class pending_op {
 public:
  template <class Op>
  explicit pending_op(Op op)
      : thread_([this, op] {
          try {
            op();
          } catch (const transport_error&) {
            failed_ns_ = now_ns();
          }
        }) {}
  long long finish() {
    thread_.join();
    return failed_ns_;
  }

 private:
  long long failed_ns_ = -1;
  std::thread thread_;
};

/// Child: a recv from `silent` (if `with_recv`) and an all-reduce over `group`, both left time
/// to block.
std::vector<std::unique_ptr<pending_op>> block(host_transport& t, int silent,
                                               std::vector<int> group, bool with_recv) {
  std::vector<std::unique_ptr<pending_op>> ops;
  if (with_recv)
    ops.push_back(std::make_unique<pending_op>([&t, silent] {
      std::vector<std::byte> buf(1 << 20);
      t.recv(silent, 9, buf);
    }));
  ops.push_back(std::make_unique<pending_op>([&t, group] {
    std::vector<float> v(1'000'000, 1.0f);
    t.all_reduce_sum(group, v, 1);
  }));
  std::this_thread::sleep_for(150ms);
  return ops;
}

/// Child: the mesh is up everywhere once one all-reduce over it has completed.
void warm_up(host_transport& t) {
  std::vector<float> v(1000, 1.0f);
  t.all_reduce_sum(everyone(t.world_size()), v);
}

std::vector<long long> numbers(const std::string& line, const std::string& word) {
  std::istringstream in(line);
  std::string first;
  in >> first;
  if (first != word) throw std::runtime_error("expected '" + word + "', got: " + line);
  std::vector<long long> v;
  for (long long x; in >> x;) v.push_back(x);
  return v;
}

void expect(const std::string& got, const std::string& want) {
  if (got != want) throw std::runtime_error("expected '" + want + "', got: " + got);
}

struct row {
  std::string scenario, what;
  std::vector<double> ms;
};

/// The row (scenario, what), created on first use; rows keep their first-use order.
row& at(std::vector<row>& rows, const std::string& scenario, const std::string& what) {
  for (auto& r : rows)
    if (r.scenario == scenario && r.what == what) return r;
  return rows.emplace_back(row{scenario, what, {}});
}

double since(long long from_ns, long long at_ns) {
  if (at_ns < 0) throw std::runtime_error("an operation completed instead of failing");
  return static_cast<double>(at_ns - from_ns) / 1e6;
}

/// kill -9 of one of 4 ranks: each survivor has a recv from it and an all-reduce over all 4
/// pending, and must see both fail by itself.
void kill_a_peer(std::vector<row>& rows) {
  constexpr int world = 4, victim = 3;
  process_group g(world, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, world, 1);
    warm_up(*t);
    if (rank == victim) {
      line.send("ready");
      line.read();  // killed here
      return;
    }
    auto ops = block(*t, victim, everyone(world), true);
    line.send("ready");
    const long long recv_ns = ops[0]->finish();
    const long long reduce_ns = ops[1]->finish();
    line.send("failed " + std::to_string(recv_ns) + " " + std::to_string(reduce_ns));
    // Keep this epoch open until every survivor has reported, so that each failure is the
    // kill's and not another survivor's leaving.
    line.read();
  });
  g.exchange_ports(everyone(world));
  for (int r = 0; r < world; ++r) expect(g.read(r), "ready");
  const long long kill_ns = now_ns();
  g.signal(victim, SIGKILL);
  g.wait(victim);
  const std::string scenario = "kill -9 of 1 of 4 ranks";
  for (int r = 0; r < victim; ++r) {
    const auto t = numbers(g.read(r), "failed");
    at(rows, scenario, "survivor's recv from it fails").ms.push_back(since(kill_ns, t.at(0)));
    at(rows, scenario, "survivor's all-reduce fails").ms.push_back(since(kill_ns, t.at(1)));
  }
  for (int r = 0; r < victim; ++r) g.send(r, "leave");
  for (int r = 0; r < victim; ++r) g.wait(r);
}

/// abort() on rank 0 of 3 while rank 2 is frozen: rank 0's own recv (from the frozen rank) and
/// all-reduce fail with `aborted`, and rank 1's all-reduce fails because rank 0 closed its links.
void abort_with_frozen_peer(std::vector<row>& rows) {
  constexpr int world = 3, victim = 2;
  process_group g(world, [](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, world, 1);
    warm_up(*t);
    if (rank == victim) {
      line.send("ready");
      line.read();  // frozen, then killed, here
      return;
    }
    auto ops = block(*t, victim, everyone(world), rank == 0);
    line.send("ready");
    if (rank == 0) {
      expect(line.read(), "abort");
      const long long call_ns = now_ns();
      t->abort("failure detector: rank 2 is not responding");
      const long long returned_ns = now_ns();
      const long long recv_ns = ops[0]->finish();
      const long long reduce_ns = ops[1]->finish();
      line.send("aborted " + std::to_string(call_ns) + " " + std::to_string(returned_ns) + " " +
                std::to_string(recv_ns) + " " + std::to_string(reduce_ns));
    } else {
      line.send("failed " + std::to_string(ops[0]->finish()));
    }
    line.read();
  });
  g.exchange_ports(everyone(world));
  expect(g.read(victim), "ready");
  g.signal(victim, SIGSTOP);
  for (int r = 0; r < victim; ++r) expect(g.read(r), "ready");
  g.send(0, "abort");
  const auto a = numbers(g.read(0), "aborted");
  const long long call_ns = a.at(0);
  const std::string scenario = "abort() on 1 of 3 ranks, 1 frozen";
  at(rows, scenario, "abort() returns").ms.push_back(since(call_ns, a.at(1)));
  at(rows, scenario, "its recv from the frozen rank fails").ms.push_back(since(call_ns, a.at(2)));
  at(rows, scenario, "its all-reduce fails").ms.push_back(since(call_ns, a.at(3)));
  const auto b = numbers(g.read(1), "failed");
  at(rows, scenario, "the other survivor's all-reduce fails").ms.push_back(since(call_ns, b.at(0)));
  for (int r = 0; r < victim; ++r) g.send(r, "leave");
  for (int r = 0; r < victim; ++r) g.wait(r);
  g.signal(victim, SIGKILL);
  g.wait(victim);
}

/// Rank 1 frozen: rank 0 makes a copying send of 32 MiB and a zero-copy send of 64 MiB (far more
/// than the socket buffers take). Then rank 1 is killed (`kill`) or rank 0 aborts: how long
/// until the zero-copy send's keep-alive is released, or abort() returns.
void frozen_receiver(std::vector<row>& rows, bool kill) {
  process_group g(2, [kill](int rank, parent_line& line) {
    auto t = join_mesh(line, rank, 2, 1);
    warm_up(*t);
    line.send("ready");
    if (rank == 1) {
      line.read();  // frozen, then killed, here
      return;
    }
    expect(line.read(), "go");
    const std::vector<std::byte> copied(std::size_t{32} << 20, std::byte{4});
    const long long copy_ns = now_ns();
    t->send(1, 4, copied);
    const long long copied_ns = now_ns();
    auto owner = std::make_shared<const std::vector<std::byte>>(std::size_t{64} << 20, std::byte{3});
    const std::weak_ptr<const std::vector<std::byte>> held = owner;
    const std::span<const std::byte> bytes(*owner);
    t->send(1, 5, bytes, std::move(owner));
    line.send("sent " + std::to_string(copy_ns) + " " + std::to_string(copied_ns));
    if (kill) {
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (!held.expired() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(20us);
      line.send("released " + std::to_string(held.expired() ? now_ns() : -1));
    } else {
      expect(line.read(), "abort");
      const long long call_ns = now_ns();
      t->abort("bench abort");
      const long long returned_ns = now_ns();
      if (!held.expired()) throw std::runtime_error("abort() returned before the keep-alive went");
      line.send("aborted " + std::to_string(call_ns) + " " + std::to_string(returned_ns));
    }
  });
  g.exchange_ports({0, 1});
  for (int r = 0; r < 2; ++r) expect(g.read(r), "ready");
  g.signal(1, SIGSTOP);
  g.send(0, "go");
  const auto sent = numbers(g.read(0), "sent");
  at(rows, "receiver frozen", "copying send of 32 MiB returns").ms.push_back(since(sent.at(0), sent.at(1)));
  if (kill) {
    const long long kill_ns = now_ns();
    g.signal(1, SIGKILL);
    g.wait(1);
    const auto released = numbers(g.read(0), "released");
    at(rows, "kill -9 of the frozen receiver", "64 MiB zero-copy send's keep-alive released")
        .ms.push_back(since(kill_ns, released.at(0)));
    g.wait(0);
  } else {
    g.send(0, "abort");
    const auto a = numbers(g.read(0), "aborted");
    at(rows, "abort() with the receiver frozen", "abort() returns, keep-alive released")
        .ms.push_back(since(a.at(0), a.at(1)));
    g.wait(0);
    g.signal(1, SIGKILL);
    g.wait(1);
  }
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  std::string json_path = "transport_failure_latency.json";
  bool quick = false;
  oobleck::bench::flag_set app{
      "transport_failure_latency: how fast pending operations of the host transport fail after a peer's\n"
      "kill -9 or an abort() (ranks as processes on loopback).",
      "transport_failure_latency"};
  app.add_switch("--quick", quick, "one run of each scenario");
  app.add_integer("--runs", runs, 1, 10000, "runs of each scenario (default 10)");
  app.add_text("--json", json_path, "write the results to PATH (default transport_failure_latency.json)");
  if (const auto exit = app.parse(argc, argv)) return *exit;
  if (quick) runs = 1;
  std::vector<row> rows;
  try {
    for (int run = 0; run < runs; ++run) {
      std::cerr << "run " << run + 1 << " of " << runs << "\r" << std::flush;
      kill_a_peer(rows);
      abort_with_frozen_peer(rows);
      frozen_receiver(rows, true);
      frozen_receiver(rows, false);
    }
    std::cerr << "\n";
  } catch (const std::exception& e) {
    std::cerr << "\ntransport_failure_latency: " << e.what() << "\n";
    return 1;
  }
  std::printf("failure -> failed operations, ms after the failure (%d runs of each scenario)\n", runs);
  std::printf("%-34s %-46s %7s %8s %8s %8s\n", "scenario", "what", "samples", "min", "median", "max");
  ordered_json out = ordered_json::array();
  std::string last;
  for (const auto& r : rows) {
    std::printf("%-34s %-46s %7zu %8.2f %8.2f %8.2f\n", r.scenario == last ? "" : r.scenario.c_str(),
                r.what.c_str(), r.ms.size(), quantile(r.ms, 0), quantile(r.ms, 0.5), quantile(r.ms, 1));
    last = r.scenario;
    ordered_json row;
    row["scenario"] = r.scenario;
    row["what"] = r.what;
    row["samples"] = static_cast<std::int64_t>(r.ms.size());
    row["min_ms"] = quantile(r.ms, 0);
    row["median_ms"] = quantile(r.ms, 0.5);
    row["max_ms"] = quantile(r.ms, 1);
    row["ms"] = r.ms;
    out.push_back(std::move(row));
  }
  ordered_json doc;
  doc["benchmark"] = "transport_failure_latency";
  doc["runs"] = runs;
  doc["rows"] = std::move(out);
  std::ofstream(json_path) << doc.dump(2) << "\n";
  std::printf("\nresults written to %s\n", json_path.c_str());
  return 0;
}
