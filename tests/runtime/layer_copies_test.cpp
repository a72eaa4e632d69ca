// A rank's part of a new epoch's layer copies (runtime/layer_copies), with ranks on threads of one
// process over loopback: what the copies deliver, and that each link runs as soon as it is up.

// LibTorch first: its logging's CHECK must not replace doctest's.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "runtime/host_communicator.hpp"
#include "runtime/layer_copies.hpp"
#include "runtime/transport_test_support.hpp"
#include "support/fake_communicator.hpp"

using namespace oobleck;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

runtime::gpt_config tiny_model() {
  return {.vocab = 64, .d_model = 16, .heads = 2, .blocks = 3, .seq_len = 8};
}

/// A layer whose whole state (parameters and both moments) differs from its seeded values.
void perturb(runtime::layer_store& store, int layer) {
  auto source = store.copy_of(layer);
  for (std::size_t k = 0; k < source.buffers.size(); ++k) source.buffers[k].add_(0.25 * static_cast<double>(k + 1));
}

bool same_state(const runtime::layer_store& a, const runtime::layer_store& b, int layer) {
  const auto x = a.copy_of(layer), y = b.copy_of(layer);
  if (x.header != y.header || x.buffers.size() != y.buffers.size()) return false;
  for (std::size_t k = 0; k < x.buffers.size(); ++k)
    if (!torch::equal(x.buffers[k], y.buffers[k])) return false;
  return true;
}

/// One store per rank, holding layers [first, end) of its pair, each perturbed.
std::vector<std::unique_ptr<runtime::layer_store>> perturbed_stores(const runtime::gpt_config& model,
                                                                    const std::vector<std::pair<int, int>>& held) {
  std::vector<std::unique_ptr<runtime::layer_store>> stores;
  for (const auto& [first, end] : held) {
    stores.push_back(std::make_unique<runtime::layer_store>(model));
    stores.back()->ensure(first, end);
    for (int l = first; l < end; ++l) perturb(*stores.back(), l);
  }
  return stores;
}

/// Every copy of the plan arrived whole, and the ranks' bytes add up.
void check_copied(const std::vector<std::unique_ptr<runtime::layer_store>>& stores,
                  const std::vector<runtime::copy_entry>& plan, const std::vector<runtime::copy_timing>& timing) {
  for (const auto& c : plan) {
    CAPTURE(c.layer);
    CAPTURE(c.target);
    CHECK(stores[static_cast<std::size_t>(c.target)]->holds(c.layer));
    CHECK(same_state(*stores[static_cast<std::size_t>(c.source)], *stores[static_cast<std::size_t>(c.target)], c.layer));
  }
  std::int64_t sent = 0, received = 0;
  for (const auto& t : timing) {
    sent += t.bytes_sent;
    received += t.bytes_received;
    CHECK(t.copy_wait_us <= t.copies_us);
  }
  CHECK(sent > 0);
  CHECK(sent == received);
}

}  // namespace

TEST_CASE("covered_micros counts the union of spans once") {
  const auto t0 = clock_type::now();
  auto at = [&](int us) { return t0 + std::chrono::microseconds(us); };
  CHECK(runtime::covered_micros({}) == 0);
  CHECK(runtime::covered_micros({{at(0), at(10)}}) == 10);
  CHECK(runtime::covered_micros({{at(0), at(10)}, {at(5), at(20)}}) == 20);   // overlapping
  CHECK(runtime::covered_micros({{at(30), at(40)}, {at(0), at(10)}}) == 20);  // a gap is not counted
  CHECK(runtime::covered_micros({{at(0), at(50)}, {at(10), at(20)}}) == 50);  // nested
  CHECK(runtime::covered_micros({{at(10), at(10)}, {at(20), at(5)}}) == 0);   // empty, reversed
}

TEST_CASE("layer copies run link by link: two ranks copying both ways do not wait for a third rank") {
  // Ranks 0 and 1 swap a layer each; rank 2 sends rank 0 a layer but joins the mesh only once
  // rank 1 is done. A rank that waited for all its links before telling its sources it is
  // ready (rank 0 here) would hold up rank 1 for good.
  const auto model = tiny_model();
  auto stores = perturbed_stores(model, {{0, 2}, {2, 4}, {4, 5}});
  const std::vector<runtime::copy_entry> plan{{.layer = 0, .source = 0, .target = 1},
                                               {.layer = 2, .source = 1, .target = 0},
                                               {.layer = 4, .source = 2, .target = 0}};

  auto ts = runtime::transport_testing::make_transports(3, 1);
  const auto eps = runtime::transport_testing::endpoints_of(ts);
  std::vector<std::unique_ptr<runtime::host_communicator>> comms;
  for (auto& t : ts) comms.push_back(std::make_unique<runtime::host_communicator>(*t));
  std::vector<runtime::copy_timing> timing(3);
  std::promise<void> rank1_done;
  constexpr auto late = 300ms;  // how long after rank 1 is done rank 2 joins
  auto rank = [&](int r) {
    auto& store = *stores[static_cast<std::size_t>(r)];
    runtime::layer_copies copies(store, r, true, plan);  // every rank runs a stage
    timing[static_cast<std::size_t>(r)] = copies.run(*ts[static_cast<std::size_t>(r)], *comms[static_cast<std::size_t>(r)]);
  };
  // As in a forming stage, the mesh connects on threads of its own while the copies run; ranks 0
  // and 1's connect() returns only once rank 2 is there.
  auto connect = [&](int r) { ts[static_cast<std::size_t>(r)]->connect(eps); };
  std::vector<std::future<void>> connecting;
  connecting.push_back(std::async(std::launch::async, connect, 0));
  connecting.push_back(std::async(std::launch::async, connect, 1));
  auto r0 = std::async(std::launch::async, rank, 0);
  auto r1 = std::async(std::launch::async, [&] {
    rank(1);
    rank1_done.set_value();
  });
  std::future<void> r2;
  const runtime::transport_testing::abort_all_on_exit guard{ts};  // a failed check must not leave the ranks waiting for each other
  REQUIRE_MESSAGE(rank1_done.get_future().wait_for(20s) == std::future_status::ready,
                  "rank 1's copies waited for rank 2, which joins only after them");
  r1.get();
  std::this_thread::sleep_for(late);
  connecting.push_back(std::async(std::launch::async, connect, 2));
  r2 = std::async(std::launch::async, rank, 2);
  REQUIRE(r0.wait_for(20s) == std::future_status::ready);
  REQUIRE(r2.wait_for(20s) == std::future_status::ready);
  r0.get();
  r2.get();
  for (auto& c : connecting) c.get();

  check_copied(stores, plan, timing);
  // Rank 0 copied with rank 1 at once and with rank 2 after the pause: the pause, spent waiting
  // for rank 2's link, is not copy time.
  CHECK(timing[0].copies_us < std::chrono::duration_cast<std::chrono::microseconds>(late).count());
  CHECK(timing[0].copies_us > 0);
}

TEST_CASE("a copy whose sender never sends fails at its deadline, naming the sender") {
  // Rank 1 is to receive layer 0 from rank 0; rank 0's link comes up, but it never runs its
  // copies (frozen, or stuck elsewhere). Rank 1 must give up at its deadline, not wait for good.
  const auto model = tiny_model();
  runtime::layer_store source(model), target(model);
  source.ensure(0, 1);
  const std::vector<runtime::copy_entry> plan{{.layer = 0, .source = 0, .target = 1}};
  auto ts = runtime::transport_testing::make_transports(2, 1);
  const auto eps = runtime::transport_testing::endpoints_of(ts);
  auto connect0 = std::async(std::launch::async, [&] { ts[0]->connect(eps); });
  auto connect1 = std::async(std::launch::async, [&] { ts[1]->connect(eps); });
  runtime::host_communicator comm(*ts[1]);
  constexpr auto limit = 400ms;
  auto copying = std::async(std::launch::async, [&]() -> std::string {
    runtime::layer_copies copies(target, 1, true, plan);
    try {
      copies.run(*ts[1], comm, limit);
    } catch (const runtime::transport_error& e) {
      CHECK(e.kind() == runtime::transport_failure::peer_lost);
      CHECK(e.peer() == 0);
      return e.what();
    } catch (const std::exception& e) {
      return std::string("another error: ") + e.what();
    }
    return "";
  });
  const runtime::transport_testing::abort_all_on_exit guard{ts};
  const auto started = clock_type::now();
  REQUIRE_MESSAGE(copying.wait_for(limit + runtime::transport_testing::fails_within) == std::future_status::ready,
                  "the copy still waits long after its deadline");
  const double took_ms = runtime::transport_testing::ms_since(started);
  const std::string what = copying.get();
  CAPTURE(what);
  CHECK(what.find("missed their deadline of 400 ms") != std::string::npos);
  CHECK(what.find("rank 0 sent 0 of its 4 messages") != std::string::npos);
  CHECK(took_ms >= 0.9 * static_cast<double>(limit.count()));
  CHECK(!target.holds(0));
  CHECK(ts[1]->aborted());  // rank 1's data plane is closed: its peers' operations fail too
  connect0.get();
  connect1.get();
}

TEST_CASE("layer copies over a queued data plane (NCCL's way): every layer arrives whole, ranks copying both ways at once") {
  // The fake hub queues sends and blocks receives, as NCCL's communicator does. Ranks 0 and 1
  // swap layers, and rank 2 sends to both: no ready messages, no link to wait for.
  const auto model = tiny_model();
  auto stores = perturbed_stores(model, {{0, 2}, {2, 4}, {0, 5}});
  perturb(*stores[2], 4);  // rank 2's copies differ from anything the others hold
  const std::vector<runtime::copy_entry> plan{{.layer = 0, .source = 0, .target = 1},
                                               {.layer = 2, .source = 1, .target = 0},
                                               {.layer = 4, .source = 2, .target = 0},
                                               {.layer = 3, .source = 1, .target = 0},
                                               {.layer = 4, .source = 2, .target = 1}};
  // What rank 2 sends, before anything arrives anywhere.
  const auto layer4 = stores[2]->copy_of(4);
  testing::fake_hub hub(3);
  std::vector<runtime::copy_timing> timing(3);
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto& store = *stores[static_cast<std::size_t>(r)];
      runtime::layer_copies copies(store, r, r != 2, plan);  // rank 2 only sends
      timing[static_cast<std::size_t>(r)] = copies.run(hub.at(r));
    }));
  for (auto& f : ranks) REQUIRE(f.wait_for(20s) == std::future_status::ready);
  for (auto& f : ranks) f.get();

  check_copied(stores, plan, timing);
  CHECK((stores[0]->copy_of(4).header == layer4.header));
  CHECK(torch::equal(stores[1]->copy_of(4).buffers[0], layer4.buffers[0]));
  CHECK(timing[2].bytes_received == 0);
}

TEST_CASE("layer copies over a queued data plane: a source that dies fails the copy, installs nothing, aborts the rank") {
  const auto model = tiny_model();
  runtime::layer_store source(model), target(model);
  source.ensure(0, 2);
  target.ensure(1, 2);
  const std::vector<runtime::copy_entry> plan{{.layer = 0, .source = 0, .target = 1}};
  testing::fake_hub hub(3);
  hub.crash(0);  // before it sends anything
  runtime::layer_copies copies(target, 1, true, plan);
  CHECK_THROWS_AS(copies.run(hub.at(1)), runtime::comm_error);
  CHECK(!target.holds(0));
  CHECK(target.holds(1));
  // The rank's data plane is aborted: its next operation fails at once, also with a live peer.
  CHECK_THROWS_AS(hub.at(1).send(torch::zeros({1}), 2, 1), runtime::comm_error);
  // A plan that sends a layer its source does not hold is refused before anything moves.
  runtime::layer_copies wrong(target, 1, true, {{.layer = 3, .source = 1, .target = 0}});
  CHECK_THROWS_AS(wrong.run(hub.at(1)), std::logic_error);
}

TEST_CASE("a copy's time limit grows with its bytes, past the mesh's connect timeout") {
  const auto model = tiny_model();
  runtime::layer_store store(model);
  store.ensure(0, 5);
  runtime::layer_copies nothing(store, 0, true, {});
  CHECK(nothing.bytes() == 0);
  CHECK(nothing.time_limit(2000ms) > 2000ms);
  CHECK(nothing.time_limit(2000ms) < 2100ms);
  runtime::layer_copies sending(store, 0, true, {{.layer = 0, .source = 0, .target = 1}, {.layer = 1, .source = 0, .target = 2}});
  const auto params = [&](int l) { return static_cast<std::int64_t>(store.flat_parameters(l).nbytes()); };
  CHECK(sending.bytes() == 3 * (params(0) + params(1)) + 2 * static_cast<std::int64_t>(runtime::layer_store::copy_header_bytes()));
  const double seconds = static_cast<double>(sending.bytes()) / runtime::copy_floor_bytes_per_second;
  CHECK(sending.time_limit(2000ms).count() >= 2000 + static_cast<std::int64_t>(seconds * 1000));
}

TEST_CASE("largest_frame_bytes bounds every frame an epoch of the model sends") {
  for (const auto& model : {tiny_model(), runtime::gpt_config{.vocab = 256, .d_model = 64, .heads = 4, .blocks = 2, .seq_len = 128},
                            runtime::gpt_config{.vocab = 50'000, .d_model = 32, .heads = 2, .blocks = 1, .seq_len = 16}}) {
    CAPTURE(model.vocab);
    CAPTURE(model.d_model);
    constexpr std::int64_t microbatch = 8;
    const std::uint64_t bound = runtime::largest_frame_bytes(model, microbatch);
    runtime::layer_store store(model);
    store.ensure(0, model.num_layers());
    std::uint64_t largest = 0;
    for (int l = 0; l < model.num_layers(); ++l)
      for (const auto& b : store.copy_of(l).buffers) largest = std::max<std::uint64_t>(largest, b.nbytes());
    const auto activation = static_cast<std::uint64_t>(microbatch * model.seq_len * model.d_model) * sizeof(float);
    CHECK(largest <= bound / 2);  // the margin of two holds
    CHECK(activation <= bound / 2);
    CHECK(bound >= (std::uint64_t{1} << 20));  // an all-reduce segment
    CHECK(bound <= 2 * std::max({largest, activation, std::uint64_t{1} << 20}));  // not a blanket allowance
  }
}
